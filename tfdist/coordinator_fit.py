"""Keras 3 ``fit`` and ``evaluate`` under ParameterServerStrategy, driven by a ClusterCoordinator.

Keras 3's trainer has no ``ClusterCoordinator`` support (keras#18624; the ``parameter_server_fit``
shim of `tfdist.compat.KERAS3_SHIMS` says for which versions). Where it applies, the shim routes
``model.fit``/``model.evaluate`` here (and `tfdist.fit` comes here too), so a script written
like TensorFlow's parameter-server guide trains unchanged. The loop is tf-keras's: the chief
(coordinator) builds the model's, metrics' and optimizer's variables on the ps tasks, makes one
dataset per worker, schedules each step (``model.train_step``, the user's own if overridden) on
whichever worker is free, and at each epoch's end waits for them (``join``) and reads the
metrics, whose variables all workers share. Steps are asynchronous, as under tf-keras; a worker
that dies is survived the same way (its steps run elsewhere; back, its dataset is rebuilt).

Input (`worker_source`): ``strategy.distribute_dataset(dataset_fn)`` of a tfdist strategy
(`PerWorkerInput`), a ``dataset_fn(input_context)`` (each worker gets its own
``input_pipeline_id``, so ``dataset.shard`` gives it its own shard), a per-worker dataset made with
``coordinator.create_per_worker_dataset``, or a ``tf.data.Dataset`` (every worker reads all of
it, as under tf-keras). ``steps_per_epoch`` is required; ``validation_data`` (same forms) needs
``validation_steps`` and is evaluated through the coordinator too. tf-keras's
``DatasetCreator`` does not exist in Keras 3: ``tf.keras.utils.experimental`` says so and names
``TF_USE_LEGACY_KERAS=1`` (shim ``tf_keras_only_names``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tensorflow as tf
from tensorflow.python.distribute.sharded_variable import ShardedVariable

from tfdist.core import flavour
from tfdist.errors import KerasCompatibilityError, StrategyConfigError, format_error

__all__ = ["require_steps", "PerWorkerInput", "per_worker_dataset_fn", "FIT_ARGS",
           "EVALUATE_ARGS", "coordinator_fit", "coordinator_evaluate"]

DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]

FIT_ARGS = ("epochs", "verbose", "callbacks", "initial_epoch", "steps_per_epoch",
            "validation_data", "validation_steps", "validation_freq")
"""The ``fit`` arguments the coordinator honours (x aside)."""

EVALUATE_ARGS = ("steps", "verbose", "callbacks", "return_dict")
"""The ``evaluate`` arguments the coordinator honours (x aside)."""


@dataclasses.dataclass(frozen=True)
class PerWorkerInput:
    """What ParameterServerStrategy's ``distribute_dataset`` returns under Keras 3.

    Attributes:
        dataset_fn: ``dataset_fn(input_context)``, already sharded per worker.
        worker_dataset_fn: The same, reading the worker's index at run time on the worker.
        options: ``tf.distribute.InputOptions`` (or None).
    """

    dataset_fn: DatasetFn
    worker_dataset_fn: DatasetFn
    options: Any = None

    def __repr__(self) -> str:  # Keras 3's own model.fit shows it in "Unrecognized data type"
        return ("PerWorkerInput (Keras 3's model.fit cannot train under ParameterServerStrategy "
                "without tfdist's shims, keras#18624; Fix: unset TFDIST_KERAS_SHIMS, or call "
                "tfdist.fit(model, this, ...))")


def per_worker_dataset_fn(dataset_fn: DatasetFn, num_workers: int) -> DatasetFn:
    """Gives ``dataset_fn`` the context of the worker it runs on.

    TF passes every worker the same context (one pipeline, id 0): the function is traced once on
    the coordinator and run on each worker. The worker's index is a call-time value
    (``experimental_get_current_worker_index``), so ``input_pipeline_id`` is a scalar int64
    tensor here, fine for ``Dataset.shard``, not for Python ``if``.
    """

    def worker_fn(tf_context: tf.distribute.InputContext) -> tf.data.Dataset:
        index = tf.distribute.coordinator.experimental_get_current_worker_index()
        context = tf.distribute.InputContext(
            num_input_pipelines=num_workers,
            input_pipeline_id=index,
            num_replicas_in_sync=tf_context.num_replicas_in_sync,
        )
        return dataset_fn(context)

    return worker_fn


@dataclasses.dataclass(frozen=True)
class WorkerSource:
    """Input the coordinator can feed: its element spec (to build the model) and a maker of the
    per-worker dataset (iterate it for one iterator per worker)."""

    element_spec: Any
    make: Callable[[], Any]


def worker_source(strategy: Any, data: Any, argument: str = "x") -> WorkerSource:
    """``data`` (see the module docstring) as a `WorkerSource` of ``strategy``'s coordinator.

    Raises:
        StrategyConfigError: ``data`` is none of the accepted forms.
    """
    def coordinator() -> Any:
        return tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)

    if isinstance(data, tf.data.Dataset):
        return WorkerSource(data.element_spec,
                            lambda: coordinator().create_per_worker_dataset(data))
    if hasattr(data, "element_spec") and hasattr(data, "build") and callable(
            getattr(data, "__iter__", None)):  # coordinator.create_per_worker_dataset(...)
        return WorkerSource(data.element_spec, lambda: data)
    if callable(data) and not isinstance(data, PerWorkerInput):
        data = PerWorkerInput(data, per_worker_dataset_fn(data, strategy.extended._num_workers))
    if isinstance(data, PerWorkerInput):
        source = data

        def distributed() -> Any:
            return strategy.distribute_datasets_from_function(source.worker_dataset_fn,
                                                              source.options)

        def per_worker() -> Any:
            return coordinator().create_per_worker_dataset(distributed)

        spec = source.dataset_fn(tf.distribute.InputContext()).element_spec
        return WorkerSource(spec, per_worker)
    raise StrategyConfigError(format_error(
        "Under ParameterServerStrategy with Keras 3 the input is fed to each worker by the "
        "coordinator.",
        received=f"{argument}={type(data).__name__}",
        expected="a dataset_fn(input_context), coordinator.create_per_worker_dataset(...), "
        "strategy.distribute_dataset(dataset_fn) of tfdist, or a tf.data.Dataset",
        fix=f"pass {argument}=dataset_fn (it shards with input_context) and batch in it"))


def check_arguments(given: Mapping[str, Any], accepted: Sequence[str], what: str) -> None:
    """Raises if ``given`` names an argument the coordinator cannot honour."""
    unsupported = sorted(set(given) - set(accepted))
    if unsupported:
        raise StrategyConfigError(format_error(
            f"model.{what} under ParameterServerStrategy with Keras 3 runs through the "
            "coordinator, which cannot honour every argument.",
            received=", ".join(unsupported), expected=f"x and {', '.join(accepted)} only",
            fix="batch, weight and shuffle samples in dataset_fn; drop the others"))


def require_steps(value: Any, name: str, what: str,
                  strategy: str = "ParameterServerStrategy", fix: str | None = None) -> int:
    """``value`` as an int; raises when it is missing (``model.<what>`` needs ``name``).

    Example:
        >>> require_steps(4, "validation_steps", "fit")
        4
        >>> require_steps(None, "steps", "evaluate")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        tfdist.errors.StrategyConfigError: model.evaluate under ParameterServerStrategy needs ...
    """
    if value is None:
        raise StrategyConfigError(format_error(
            f"model.{what} under {strategy} needs {name}.",
            received=f"{name}=None", expected="a positive int",
            fix=fix or f"repeat the dataset in dataset_fn and pass {name}"))
    return int(value)



def coordinator_fit(model: Any, x: Any = None, y: Any = None, **kwargs: Any) -> Any:
    """``model.fit`` for Keras 3 under ParameterServerStrategy (see the module docstring).

    Raises:
        StrategyConfigError: ``y``, an argument outside `FIT_ARGS`, input of another form, or
            ``steps_per_epoch`` (``validation_steps`` with ``validation_data``) missing.
    """
    check_arguments({**kwargs, **({"y": y} if y is not None else {})}, FIT_ARGS, "fit")
    steps = require_steps(kwargs.get("steps_per_epoch"), "steps_per_epoch", "fit")
    strategy = model.distribute_strategy
    validation = kwargs.get("validation_data")
    if validation is not None:
        validation_steps = require_steps(kwargs.get("validation_steps"), "validation_steps", "fit")
        validation = (worker_source(strategy, validation, "validation_data"), validation_steps)
    train = worker_source(strategy, x)
    build(model, strategy, train.element_spec)
    return _Loop(model, strategy).fit(
        train, steps, validation, epochs=kwargs.get("epochs", 1),
        initial_epoch=kwargs.get("initial_epoch", 0),
        validation_freq=kwargs.get("validation_freq", 1),
        callbacks=_callbacks(model, kwargs, epochs=kwargs.get("epochs", 1), steps=steps))


def coordinator_evaluate(model: Any, x: Any = None, y: Any = None, **kwargs: Any) -> Any:
    """``model.evaluate`` for Keras 3 under ParameterServerStrategy: ``steps`` test steps
    scheduled on the workers; returns what Keras returns (a scalar, a list, or a dict)."""
    check_arguments({**kwargs, **({"y": y} if y is not None else {})}, EVALUATE_ARGS,
                    "evaluate")
    steps = require_steps(kwargs.get("steps"), "steps", "evaluate")
    strategy = model.distribute_strategy
    source = worker_source(strategy, x)
    build(model, strategy, source.element_spec)
    callbacks = _callbacks(model, kwargs, epochs=1, steps=steps)
    logs = _Loop(model, strategy).evaluate(source, steps, callbacks)
    if kwargs.get("return_dict"):
        return logs
    values = list(logs.values())
    return values[0] if len(values) == 1 else values


def _callbacks(model: Any, kwargs: Mapping[str, Any], epochs: int, steps: int) -> Any:
    keras = flavour.get_keras("keras3")
    verbose = kwargs.get("verbose", "auto")
    callbacks = kwargs.get("callbacks")
    if not isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = keras.callbacks.CallbackList(
            list(callbacks or ()), add_history=True,
            add_progbar=verbose not in (0, "silent"),
            verbose=1 if verbose == "auto" else verbose, epochs=epochs, steps=steps,
            model=model)
    return callbacks


def build(model: Any, strategy: Any, element_spec: Any) -> None:
    """Creates the model's, metrics' and optimizer's variables (on the ps tasks) before any step
    runs: a scheduled function may not create variables. Only the input's shapes are needed."""
    with strategy.scope():
        # Keras 3's own pre-fit build (private; what its fit calls), from TensorSpecs.
        model._symbolic_build(data_batch=element_spec)
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
    sharded = [v.path for v in model.trainable_variables
               if isinstance(getattr(v, "value", None), ShardedVariable)]
    if sharded:
        raise KerasCompatibilityError(format_error(
            "Keras 3 cannot train a variable that ParameterServerStrategy's partitioner split: "
            "tf.GradientTape needs a variable's handle, and a ShardedVariable has none "
            "(measured: AttributeError: 'ShardedVariable' object has no attribute 'handle').",
            received=f"sharded variables {sharded}",
            expected="whole variables (each is placed on one ps task, round-robin)",
            fix="drop the partitioner and split a large table into several layers (one per "
            "ps task; see docs/compatibility.md), or train with tf-keras "
            "(TF_USE_LEGACY_KERAS=1), which trains sharded variables"))


class _Loop:
    """The epochs of `coordinator_fit` and the test steps of `coordinator_evaluate`."""

    def __init__(self, model: Any, strategy: Any) -> None:
        self.model, self.strategy = model, strategy
        self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)

    def step_function(self, step: Callable[[Any], Any]) -> Callable[[Any], Any]:
        strategy = self.strategy

        @tf.function
        def run(iterator: Any) -> Any:
            outputs = strategy.run(step, args=(next(iterator),))
            return tf.nest.map_structure(
                lambda v: strategy.experimental_local_results(v)[0], outputs)

        return run

    def results(self) -> dict[str, float]:
        return {name: float(value) for name, value in self.model.get_metrics_result().items()}

    def fit(self, train: WorkerSource, steps: int, validation: tuple[WorkerSource, int] | None,
            *, epochs: int, initial_epoch: int, validation_freq: int, callbacks: Any) -> Any:
        model, coordinator = self.model, self.coordinator
        iterator = iter(train.make())
        train_function = self.step_function(model.train_step)
        model.stop_training = False
        callbacks.on_train_begin()
        initial_epoch = getattr(model, "_initial_epoch", None) or initial_epoch  # BackupAndRestore
        logs: dict[str, float] = {}
        for epoch in range(initial_epoch, epochs):
            model.reset_metrics()
            callbacks.on_epoch_begin(epoch)
            for step in range(steps):
                callbacks.on_train_batch_begin(step)
                coordinator.schedule(train_function, args=(iterator,))
                callbacks.on_train_batch_end(step)
            coordinator.join()
            logs = self.results()
            if validation is not None and (epoch + 1) % validation_freq == 0:
                val_logs = self.evaluate(*validation, callbacks)
                logs.update({f"val_{name}": value for name, value in val_logs.items()})
            callbacks.on_epoch_end(epoch, logs)
            if model.stop_training:
                break
        callbacks.on_train_end(logs)
        model._initial_epoch = None
        return model.history

    def evaluate(self, source: WorkerSource, steps: int, callbacks: Any) -> dict[str, float]:
        iterator = iter(source.make())
        test_function = self.step_function(self.model.test_step)
        self.model.reset_metrics()
        callbacks.on_test_begin()
        for step in range(steps):
            callbacks.on_test_batch_begin(step)
            self.coordinator.schedule(test_function, args=(iterator,))
            callbacks.on_test_batch_end(step)
        self.coordinator.join()
        logs = self.results()
        callbacks.on_test_end(logs)
        return logs
