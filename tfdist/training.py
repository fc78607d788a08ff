"""`fit`: ``model.fit`` under every tfdist strategy and both Kerases, one entry point.

Everywhere ``model.fit`` works, `fit` is ``model.fit``. The one place it does not is Keras 3 under
ParameterServerStrategy: Keras 3's trainer has no ``ClusterCoordinator`` support (keras#18624;
the shim ``parameter_server_fit`` in `tfdist.compat.KERAS3_SHIMS` says for which Keras versions).
There `fit` runs the training itself, as tf-keras's ``fit`` does: the chief (coordinator) builds
the model and optimizer with their variables on the ps tasks (sharded when the strategy has a
partitioner), makes one dataset per worker (`create_per_worker_dataset`), schedules each step
(``model.train_step``, the user's own if overridden) on whichever worker is free, and at each
epoch's end waits for them (``join``) and reads the metrics, whose variables are shared by all
workers. Steps are asynchronous, as under tf-keras. A worker that dies is survived the same way:
the coordinator runs its steps elsewhere and, when it comes back, rebuilds its dataset.

Example:
    The same script trains with either Keras, under any strategy::

        strategy = tfdist.get_strategy("auto")
        with strategy.scope():
            model = build_model()
            model.compile(...)
        history = tfdist.fit(model, strategy.distribute_dataset(dataset_fn), epochs=3,
                             steps_per_epoch=100)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tfdist import compat
from tfdist.core import flavour
from tfdist.errors import StrategyConfigError, format_error

__all__ = ["fit", "PerWorkerInput", "optimizer_variables", "tf_variable", "track_loss"]

_COORDINATOR_FIT_ARGS = ("epochs", "verbose", "callbacks", "initial_epoch", "steps_per_epoch")


@dataclasses.dataclass(frozen=True)
class PerWorkerInput:
    """What ParameterServerStrategy's ``distribute_dataset`` returns under Keras 3.

    Attributes:
        dataset_fn: ``dataset_fn(input_context)``, already sharded per worker.
        worker_dataset_fn: The same, reading the worker's index at run time on the worker.
        options: ``tf.distribute.InputOptions`` (or None).
    """

    dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset]
    worker_dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset]
    options: Any = None

    def __repr__(self) -> str:  # Keras 3's model.fit shows it in "Unrecognized data type"
        return ("PerWorkerInput (Keras 3's model.fit cannot train under ParameterServerStrategy, "
                "keras#18624; Fix: call tfdist.fit(model, this, ...) instead of model.fit)")


def fit(model: Any, x: Any = None, y: Any = None, **kwargs: Any) -> Any:
    """``model.fit(x, y, **kwargs)``, also where Keras's own ``fit`` cannot train.

    Args:
        model: A compiled Keras model (either flavour), built in the strategy's scope.
        x: The input, as ``model.fit`` takes it; under ParameterServer, what
            ``strategy.distribute_dataset(dataset_fn)`` returns.
        y: Targets, as ``model.fit`` takes them (None for datasets).
        **kwargs: ``model.fit``'s other arguments. Under ParameterServer with Keras 3:
            ``epochs``, ``steps_per_epoch`` (required), ``callbacks``, ``verbose`` and
            ``initial_epoch``.

    Returns:
        The ``History`` of the run (``history.history["loss"]``: one value per epoch).

    Raises:
        StrategyConfigError: Under ParameterServer with Keras 3, an argument the coordinator
            cannot honour (named in the message), or ``steps_per_epoch`` missing.

    Example:
        >>> import numpy as np
        >>> keras = flavour.get_keras()
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile(optimizer="sgd", loss="mse")
        >>> history = fit(model, np.ones((8, 2)), np.ones((8, 1)), epochs=2, verbose=0)
        >>> len(history.history["loss"])
        2
    """
    strategy = model.distribute_strategy
    if not compat.fit_needs_coordinator(strategy, model):
        if isinstance(x, (tf.data.Dataset, tf.distribute.DistributedDataset)):
            kwargs.setdefault("shuffle", False)  # fit ignores it for datasets; Keras 3 warns
        return _model_fit(model, x, y, kwargs)
    unsupported = sorted(set(kwargs) - set(_COORDINATOR_FIT_ARGS))
    if y is not None or unsupported or not isinstance(x, PerWorkerInput):
        given = ", ".join(unsupported + (["y"] if y is not None else []))
        raise StrategyConfigError(format_error(
            "tfdist.fit under ParameterServerStrategy with Keras 3 takes per-worker input and "
            f"{', '.join(_COORDINATOR_FIT_ARGS)} only.",
            received=f"x={type(x).__name__}" + (f", {given}" if given else ""),
            expected="x=strategy.distribute_dataset(dataset_fn) and no other fit arguments",
            fix="batch and weight samples in dataset_fn; evaluate with the sidecar evaluator "
            "(tfdist-launch --evaluator) instead of validation_data"))
    if kwargs.get("steps_per_epoch") is None:
        raise StrategyConfigError(format_error(
            "tfdist.fit under ParameterServerStrategy needs steps_per_epoch.",
            received="steps_per_epoch=None", expected="a positive int",
            fix="repeat the dataset in dataset_fn and pass steps_per_epoch"))
    return _coordinator_fit(model, strategy, x, **kwargs)


_WRONG_SCOPE = "Mixing different tf.distribute.Strategy objects"


def _model_fit(model: Any, x: Any, y: Any, kwargs: dict[str, Any]) -> Any:
    """``model.fit``, with Keras 3's error for an optimizer made outside the model's strategy
    scope (raised while building, before the first step) turned into one that names the fix."""
    try:
        return model.fit(x, y, **kwargs)
    except RuntimeError as err:
        made_under = getattr(model.optimizer, "_distribution_strategy", None)
        if _WRONG_SCOPE not in str(err) or made_under is model.distribute_strategy:
            raise
        raise StrategyConfigError(format_error(
            "The model's optimizer was made outside the strategy's scope: Keras 3 creates the "
            "optimizer's slots (Adam's moments, SGD's momentum) under the strategy that was in "
            "scope when the optimizer was made, so fit stopped before its first step.",
            received=f"{type(model.optimizer).__name__} made under "
            f"{type(made_under).__name__}, the model under "
            f"{type(model.distribute_strategy).__name__}",
            expected="the optimizer made inside the model's strategy.scope()",
            fix="call model.compile(optimizer=...) inside the `with strategy.scope():` block "
            "that builds the model")) from err


def _coordinator_fit(model: Any, strategy: Any, data: PerWorkerInput, *, steps_per_epoch: int,
                     epochs: int = 1, verbose: Any = "auto", callbacks: Sequence[Any] = (),
                     initial_epoch: int = 0) -> Any:
    """Keras 3 training driven by a `ClusterCoordinator` (see the module docstring)."""
    keras = flavour.get_keras("keras3")
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    _build(model, strategy, data)
    iterator = iter(coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(data.worker_dataset_fn, data.options)))
    train_function = _train_function(model, strategy)
    callback_list = keras.callbacks.CallbackList(
        list(callbacks or ()), add_history=True, add_progbar=verbose not in (0, "silent"),
        verbose=1 if verbose == "auto" else verbose, epochs=epochs, steps=steps_per_epoch,
        model=model)
    model.stop_training = False
    callback_list.on_train_begin()
    initial_epoch = getattr(model, "_initial_epoch", None) or initial_epoch  # BackupAndRestore
    logs: dict[str, float] = {}
    for epoch in range(initial_epoch, epochs):
        model.reset_metrics()
        callback_list.on_epoch_begin(epoch)
        for step in range(steps_per_epoch):
            callback_list.on_train_batch_begin(step)
            coordinator.schedule(train_function, args=(iterator,))
            callback_list.on_train_batch_end(step)
        coordinator.join()
        logs = {name: float(value) for name, value in model.get_metrics_result().items()}
        callback_list.on_epoch_end(epoch, logs)
        if model.stop_training:
            break
    callback_list.on_train_end(logs)
    model._initial_epoch = None
    return model.history


def _build(model: Any, strategy: Any, data: PerWorkerInput) -> None:
    """Creates the model's, metrics' and optimizer's variables (on the ps tasks) before any step
    runs: a scheduled function may not create variables. Only the input's shapes are needed."""
    spec = data.dataset_fn(tf.distribute.InputContext()).element_spec
    with strategy.scope():
        # Keras 3's own pre-fit build (private; what its fit calls), from TensorSpecs.
        model._symbolic_build(data_batch=spec)
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)


def _train_function(model: Any, strategy: Any) -> Callable[[Any], Any]:
    @tf.function
    def train_function(iterator: Any) -> Any:
        outputs = strategy.run(model.train_step, args=(next(iterator),))
        return tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0],
                                     outputs)

    return train_function


# ------------------------------------------- variables and loss under either Keras
def tf_variable(variable: Any) -> Any:
    """The ``tf.Variable`` behind a variable of either flavour (Keras 3 keeps it in ``.value``).

    Example:
        >>> import keras, tensorflow as tf
        >>> isinstance(tf_variable(keras.Variable(1.0)), tf.Variable)
        True
    """
    import tensorflow as tf

    if isinstance(variable, tf.Variable):
        return variable
    value = getattr(variable, "value", None)
    if isinstance(value, tf.Variable):
        return value
    raise TypeError(
        format_error(
            "Expected a variable.",
            received=type(variable).__name__,
            expected="a tf.Variable or a Keras 3 variable",
            fix="pass model.variables or optimizer.variables",
        )
    )


def optimizer_variables(optimizer: Any) -> list[Any]:
    """An optimizer's variables: a property in Keras 3 and tf-keras, a method on legacy optimizers.

    Example:
        >>> import keras
        >>> [v.name for v in optimizer_variables(keras.optimizers.SGD())]
        ['iteration', 'learning_rate']
    """
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def track_loss(model: Any, loss: Any, batch: Any) -> Any:
    """Adds one batch's mean ``loss`` to ``model``'s running ``loss`` metric, as ``fit`` does.

    tf-keras's ``compute_loss`` updates the metric itself; Keras 3's ``train_step`` does it
    after ``compute_loss``. A custom ``train_step`` calling ``compute_loss`` uses this once per
    call so the ``loss`` ``fit`` shows is the same in both.
    """
    tracker = getattr(model, "_loss_tracker", None)
    if flavour.flavour_of(model) == "keras3" and tracker is not None:
        tracker.update_state(loss, sample_weight=batch)
    return loss
