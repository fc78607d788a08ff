"""``model.fit`` on a pipeline stage: a Keras ``Sequential`` of one stage's layers whose steps run
the pipeline schedule (`tfdist.pipeline.engine`), in Keras 3 and in tf-keras.

Every process of the job runs the same script: it builds its stage (`PipelineStrategy.build_model`),
compiles it with the whole model's loss and metrics, and calls ``fit``/``evaluate``/``predict``
with the same global batches. Each step a process takes its replica's rows of the batch; stage 0
uses the inputs, the last stage the targets. The last stage computes the loss and the metrics
and shares them with the other stages of its replica (averaged over replicas), so every process
shows the same progress and returns the same ``History``.

Metrics: the last stage updates the real metric objects (hidden from Keras); what Keras reads
(``model.metrics``) on every stage is a ``loss`` mean and one mirror per metric holding the shared
value. ``model.save(path)`` gathers the stages' weights and the chief writes the whole model, which
a single device loads with ``keras.models.load_model``.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import tensorflow as tf

from tfdist.compat import models as keras_compat
from tfdist.core.flavour import flavour_of, get_keras
from tfdist.errors import StrategyConfigError, format_error
from tfdist.parallel.keys import EVALUATE, METRICS, PREDICT, TRAIN
from tfdist.pipeline import optimizers, traced
from tfdist.pipeline.consistency import gated, step_checks
from tfdist.pipeline.engine import PipelineEngine
from tfdist.pipeline.loss_and_metrics import loss_terms, mean_loss, resolve_metrics
from tfdist.pipeline.zero_calls import checked_variables, layer_gathers, layered_zero, whole_weights
from tfdist.watchdog import StepWatchdog, with_deadline

STEP_TIMEOUT = 600.0
"""A pipeline batch's deadline in ``fit``, ``evaluate`` and ``predict`` when the strategy sets
none (``timeout_seconds=None``): past it the process's collectives are aborted and the step
fails naming it. A function's first batch, which traces it, gets the start-up deadline if
longer. Without it a stage whose peers were alive but never met it waited forever."""

__all__ = ["stage_model_class", "local_stages_model", "apply_step", "build_stage_optimizer"]


def apply_step(model: Any, engine: PipelineEngine, optimizer: Any, x: Any, y: Any, loss: Any,
               sample_weight: Any = None) -> tuple[Any, list[Any]]:
    """One training step of a stage model (or of all stages of a process) on its replica's rows
    ``x``, ``y`` (inside a tf.function): the schedule, the gradients averaged over replicas,
    one update. Returns the engine's ``(loss, outputs)`` (both only on the last stage)."""
    layered = layered_zero(model)
    if layered is not None:  # ZeRO stage 3: each layer gathered per call, the pieces' sums
        with layered.layerwise():
            total, grads, outs = engine.train(model.stage_calls(training=True),
                                              layered.targets(), x, y, loss, sample_weight,
                                              model.stage_loss_terms())
        layered.apply(optimizer, grads)
        return total, outs
    variables = list(model.trainable_variables)
    total, grads, outs = engine.train(model.stage_calls(training=True), model.stage_variables(),
                                      x, y, loss, sample_weight, model.stage_loss_terms())
    zero = getattr(model, "_pipeline_zero", None)
    if zero is not None:  # ZeRO on the data axis (`tfdist.zero.data_axis`)
        zero.apply(optimizer, grads, engine.average_over_replicas, combine=model.sum_tied)
    else:
        optimizers.apply_gradients(optimizer, engine, grads, variables, combine=model.sum_tied)
    return total, outs


def build_stage_optimizer(model: Any, optimizer: Any, strategy: Any) -> None:
    """Builds ``optimizer`` (if not yet) on what the stage model updates: its trainable
    variables, or under ZeRO this process's parts of them (`tfdist.zero.data_axis`)."""
    zero = getattr(model, "_pipeline_zero", None)
    if zero is not None:
        zero.build_optimizer(optimizer, strategy)
    else:
        keras_compat.build_optimizer(optimizer, list(model.trainable_variables), strategy)


def _real_data(args: tuple[Any, ...]) -> bool:
    """Whether a call's first argument holds data (not a symbolic Keras tensor)."""
    flat = tf.nest.flatten(args)
    return bool(flat) and not any(type(v).__name__ == "KerasTensor" for v in flat)


def _refuse_a_short_last_batch(dataset: tf.data.Dataset) -> None:
    """A finite dataset whose batches have no fixed size (``Dataset.batch`` without
    ``drop_remainder=True``) may end with a batch too short to cut into replicas x micro-batches:
    refused before the first step, rather than failing at that batch. A repeated dataset (its
    cardinality infinite) never ends with one."""
    if int(dataset.cardinality()) == int(tf.data.INFINITE_CARDINALITY):
        return
    raise StrategyConfigError(format_error(
        "A finite dataset whose batch size is not fixed may end with a short batch, which a "
        "pipeline cannot cut into equal micro-batches (it would fail at that batch).",
        received="a dataset with element_spec batch dimension None",
        expected="batches of a fixed size, a multiple of replicas x micro_batches",
        fix="batch with drop_remainder=True (dataset.batch(n, drop_remainder=True)), or repeat "
            "the dataset before batching and pass steps_per_epoch"))


class _StageModelMixin:
    """The pipeline's ``train_step``/``test_step``/``predict_step``; mixed into a functional
    model whose inputs are a list (the tensors the cut before the stage carries)."""

    _engine: PipelineEngine
    _pipeline: Any  # tfdist.strategies.pipeline.PipelineStrategy

    def stage_calls(self, training: bool) -> Any:
        """What the engine runs on a micro-batch: this model, on the list of its inputs
        (`tfdist.pipeline.traced.stage_call`)."""
        call = traced.stage_call(self, self._pipeline.config, training)
        return lambda a: call(list(a))

    def _call_stage(self, inputs: list[Any], training: bool) -> Any:
        return super().__call__(inputs, training=training)  # type: ignore[misc]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The stage's call; refused eagerly on real data when this process holds only part of
        the model: it would return this stage's activations as if they were the model's."""
        engine = getattr(self, "_engine", None)
        if engine is not None and self._pipeline.stages > 1 and not engine.layout.holds_all \
                and tf.executing_eagerly() and _real_data(args[:1]):
            raise StrategyConfigError(format_error(
                f"model(x) on pipeline stage {engine.layout.stage} of {self._pipeline.stages} "
                "would return this stage's activations, not the model's output.",
                received=f"model(x) called on stage {engine.layout.stage}'s model",
                expected="model.predict(x) (or evaluate) on every process",
                fix="call model.predict(x) on every process: it runs the pipeline and returns "
                    "the whole model's output everywhere"))
        return super().__call__(*args, **kwargs)  # type: ignore[misc]

    def stage_variables(self) -> Any:
        """The variables the engine differentiates, in ``trainable_variables`` order."""
        return list(self.trainable_variables)  # type: ignore[attr-defined]

    def stage_loss_terms(self) -> Any:
        """This stage's regularization losses, for the engine."""
        return loss_terms(self)

    def sum_tied(self, grads: list[Any]) -> list[Any]:
        """``grads`` with the gradients of weights tied across stages summed over the stages
        that hold them (`tfdist.pipeline.tied`)."""
        tied = getattr(self, "_pipeline_tied", None)
        return grads if tied is None else tied(grads)

    def _init_pipeline(self, engine: PipelineEngine, strategy: Any, tied: Any = None) -> None:
        self._pipeline_tied = tied
        self._engine = engine
        self._pipeline = strategy
        self._pipeline_loss = None
        self._pipeline_real_metrics: list[Any] = []
        self._pipeline_mirrors: list[Any] = []
        self._pipeline_tracker = None

    # ------------------------------------------------------------ compile
    def compile(self, optimizer: Any = "rmsprop", loss: Any = None, metrics: Any = None,
                weighted_metrics: Any = None, **kwargs: Any) -> None:
        """Like ``Model.compile``; ``loss`` and the metrics are the whole model's. As in Keras,
        sample weights weigh the loss and ``weighted_metrics``, not ``metrics``."""
        keras = get_keras(flavour_of(self))
        if loss is None:
            raise StrategyConfigError(format_error(
                "A pipeline stage needs the model's loss in compile().", received="loss=None",
                expected="compile(optimizer, loss=..., metrics=[...])",
                fix="pass the loss you would give the whole model"))
        self._pipeline_loss = mean_loss(keras.losses.get(loss))
        with keras_compat.metrics_scope(self):
            real = resolve_metrics(keras, metrics, weighted_metrics, loss)
            self._pipeline_real_metrics = real if self._engine.layout.is_last else []
            self._pipeline_tracker = keras.metrics.Mean(name="loss")
            self._pipeline_mirrors = [keras.metrics.Mean(name=m.name) for m, _ in real]
        super().compile(optimizer=optimizer, **kwargs)  # type: ignore[misc]
        self._adopt_optimizer()

    def _adopt_optimizer(self) -> None:
        """Lets an optimizer made outside ``strategy.scope()`` create its slots in ``fit``: a
        stage's variables are plain, so where the optimizer was made does not matter."""
        keras_compat.bind_unbuilt_optimizer(self.optimizer, self._pipeline)  # type: ignore[attr-defined]
        self._pipeline.check_optimizer(self.optimizer)  # type: ignore[attr-defined]

    def get_weights(self) -> list[Any]:
        """The stage's layers' weights (a tf-keras functional model would add its metrics')."""
        return [w for layer in self.layers for w in layer.get_weights()]  # type: ignore[attr-defined]

    def set_weights(self, weights: Any) -> None:
        weights = list(weights)
        for layer in self.layers:  # type: ignore[attr-defined]
            count = len(layer.weights)
            layer.set_weights(weights[:count])
            weights = weights[count:]

    @property
    def metrics(self) -> list[Any]:
        if getattr(self, "_pipeline_tracker", None) is None:
            return []
        return [self._pipeline_tracker, *self._pipeline_mirrors]

    def reset_metrics(self) -> None:
        super().reset_metrics()  # type: ignore[misc]
        for metric, _ in self._pipeline_real_metrics:
            metric.reset_state()

    # ------------------------------------------------------------ entry points
    def _check_inputs(self, x: Any, batch_size: Any) -> None:
        """Refuses, before any step, batches that do not cut into replicas x micro-batches."""
        if isinstance(x, tf.data.Dataset):
            spec = x.element_spec[0] if isinstance(x.element_spec, tuple) else x.element_spec
            spec = tf.nest.flatten(spec)[0]
            rows = spec.shape[0] if hasattr(spec, "shape") and spec.shape.rank else None
            if rows is not None:
                self._pipeline.check_rows(rows)
            elif hasattr(spec, "shape") and spec.shape.rank:
                _refuse_a_short_last_batch(x)
            return
        if isinstance(x, (list, tuple, dict)):  # a model of several inputs
            x = tf.nest.flatten(x)[0]
        rows = len(x) if hasattr(x, "__len__") else None
        if rows is None:
            return
        batch = batch_size or 32  # Keras's default
        for size in {min(batch, rows), rows % batch or min(batch, rows)}:
            self._pipeline.check_rows(size)

    def _step_watchdog(self) -> StepWatchdog:
        """This stage's batch deadline (`STEP_TIMEOUT` unless the strategy sets one)."""
        watchdog = getattr(self, "_pipeline_watchdog", None)
        if watchdog is None:
            strategy = self._pipeline
            seconds = strategy.timeout or STEP_TIMEOUT
            watchdog = StepWatchdog(
                seconds, f"pipeline's other stages and replicas (stage {strategy.layout.stage})",
                first_seconds=max(seconds, getattr(strategy, "startup_timeout", 0.0) or 0.0),
                fix="pass timeout_seconds=... to the pipeline strategy if a step is that slow.")
            self._pipeline_watchdog = watchdog
        return watchdog

    def _with_deadline(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                       position: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``fit``/``evaluate``/``predict``'s arguments with the batch deadline among the
        callbacks (``position``: of the callbacks after ``batch_size``)."""
        return with_deadline(args, kwargs, position, self._step_watchdog(),
                             get_keras(flavour_of(self)))

    def fit(self, x: Any = None, y: Any = None, batch_size: Any = None, *args: Any,
            **kwargs: Any) -> Any:
        self._check_inputs(x, batch_size)
        build_stage_optimizer(self, self.optimizer,  # type: ignore[attr-defined]
                              self.distribute_strategy)  # type: ignore[attr-defined]
        args, kwargs = self._with_deadline(args, kwargs, 2)
        return super().fit(x, y, batch_size, *args, **kwargs)  # type: ignore[misc]

    def evaluate(self, x: Any = None, y: Any = None, batch_size: Any = None, *args: Any,
                 **kwargs: Any) -> Any:
        self._check_inputs(x, batch_size)
        args, kwargs = self._with_deadline(args, kwargs, 3)
        return super().evaluate(x, y, batch_size, *args, **kwargs)  # type: ignore[misc]

    def predict(self, x: Any, batch_size: Any = None, *args: Any, **kwargs: Any) -> Any:
        self._check_inputs(x, batch_size)
        args, kwargs = self._with_deadline(args, kwargs, 2)
        return super().predict(x, batch_size, *args, **kwargs)  # type: ignore[misc]

    # ------------------------------------------------------------ steps
    def _unpack(self, data: Any, by_replica: bool = True) -> tuple[Any, Any, Any]:
        """``(x, y, sample_weight)`` of a batch: this replica's rows when training
        (``by_replica``); every row for evaluate and predict, which each replica runs whole
        (their results then need no gathering)."""
        x, y, weight = data, None, None
        if isinstance(data, (tuple, list)):
            x = data[0]
            y = data[1] if len(data) > 1 else None
            weight = data[2] if len(data) > 2 else None
        engine = self._engine
        self._pipeline.check_batch(x)
        if not by_replica:
            return x, y, weight
        return engine.replica_rows(x), engine.replica_rows(y), engine.replica_rows(weight)

    def _shared_logs(self, loss: Any | None, y: Any, y_pred: Any, sample_weight: Any = None,
                     phase: int = TRAIN) -> dict[str, Any]:
        """Updates the last stage's metrics; shares loss and metric values with every stage."""
        engine = self._engine
        if engine.layout.is_last:
            for metric, weighted in self._pipeline_real_metrics:
                metric.update_state(y, y_pred, sample_weight=sample_weight if weighted else None)
            values = tf.stack([tf.cast(loss, tf.float32),
                               *[tf.cast(m.result(), tf.float32)
                                 for m, _ in self._pipeline_real_metrics]])
            values = engine.average_over_replicas([values], kind=METRICS, phase=phase)[0]
        else:
            values = None
        count = 1 + len(self._pipeline_mirrors)
        values = engine.share(values, [count], tf.float32, index=0, phase=phase)
        step_loss = values[0]
        self._pipeline_tracker.update_state(step_loss)
        logs = {"loss": self._pipeline_tracker.result()}
        for i, mirror in enumerate(self._pipeline_mirrors):
            mirror.reset_state()
            mirror.update_state(values[1 + i])
            logs[mirror.name] = mirror.result()
        return logs

    def train_step(self, data: Any) -> dict[str, Any]:
        x, y, weight = self._unpack(data, by_replica=False)  # the global batch, checked:
        checks = step_checks(self._engine.layout, checked_variables(self), x, y, weight,
                             self.optimizer.iterations + 1, self._pipeline.timeout)
        x, y, weight = (self._engine.replica_rows(v) for v in gated(checks, x, y, weight))
        loss, outs = apply_step(self, self._engine, self.optimizer, x, y, self._pipeline_loss,
                                weight)
        y_pred = tf.concat(outs, axis=0) if outs else None
        return self._shared_logs(loss, y, y_pred, weight)

    def test_step(self, data: Any) -> dict[str, Any]:
        x, y, weight = self._unpack(data, by_replica=False)
        engine = self._engine
        with layer_gathers(self):
            outs, terms = engine.forward(self.stage_calls(training=False), x, EVALUATE,
                                         self.stage_loss_terms())
        if engine.layout.is_last:
            y_pred = tf.concat(outs, axis=0)
            loss = self._pipeline_loss(y, y_pred, weight)
            loss += tf.cast(terms, loss.dtype)
            return self._shared_logs(loss, y, y_pred, weight, EVALUATE)
        with tf.control_dependencies(outs):  # this stage's sends
            return self._shared_logs(None, y, None, weight, EVALUATE)

    def predict_step(self, data: Any) -> Any:
        x, _, _ = self._unpack(data, by_replica=False)
        engine = self._engine
        with layer_gathers(self):
            outs, _ = engine.forward(self.stage_calls(training=False), x, PREDICT)
        spec = self._pipeline.spec
        out = spec.outputs[0]
        known = None not in spec.shapes[out]  # else the last stage shares the batch's shape
        if engine.layout.is_last:
            predicted = tf.concat(outs, axis=0)
            shared = [] if known else [engine.share(tf.shape(predicted, out_type=tf.int32),
                                                    [predicted.shape.rank], tf.int32, 2, PREDICT)]
            with tf.control_dependencies(shared):  # a share nothing uses would be pruned
                return engine.share(predicted, None, spec.dtypes[out], 1, PREDICT, not known)
        shape = tf.stack([tf.shape(tf.nest.flatten(x)[0])[0], *spec.shapes[out]]) if known \
            else engine.share(None, [len(spec.shapes[out]) + 1], tf.int32, 2, PREDICT)
        with tf.control_dependencies(outs):  # this stage's sends
            return engine.share(None, shape, spec.dtypes[out], 1, PREDICT, sized=not known)

    # ------------------------------------------------------------ saving
    def whole_model(self) -> Any | None:
        """The whole model with the trained weights on the chief (None on the other processes).

        A collective: every process of the job must call it.
        """
        return self._pipeline.assemble(self)

    def save_weights(self, *args: Any, **kwargs: Any) -> Any:
        """Keras's (this process's backup: its stage and its optimizer); under ZeRO stage 3
        the stage's weights gathered whole for it (every replica saves at once)."""
        with whole_weights(self):
            return super().save_weights(*args, **kwargs)  # type: ignore[misc]

    def load_weights(self, *args: Any, **kwargs: Any) -> Any:
        """Keras's; under ZeRO stage 3 this process's parts are then taken from the loaded
        weights and the whole dropped (no collective)."""
        layered = layered_zero(self)
        with contextlib.nullcontext() if layered is None else layered.loading():
            return super().load_weights(*args, **kwargs)  # type: ignore[misc]

    def save(self, filepath: Any, *args: Any, **kwargs: Any) -> None:
        """Saves the whole model (a collective: every process calls it; the chief writes)."""
        whole = self.whole_model()
        if whole is not None:
            whole.save(filepath, *args, **kwargs)


class _LocalStagesMixin(_StageModelMixin):
    """All stages of a pipeline in one process (`tfdist.pipeline.local`): a model whose layers
    are the stage models, each on its device, and whose steps run every stage's schedule."""

    pipeline_stages: list[Any]
    pipeline_devices: tuple[str, ...]

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """Like the stage model's, as if outside any strategy scope, even when called inside
        ``strategy.scope()`` as the README's scripts do: the stages' variables were made outside
        it (so that each sits on its stage's device), and Keras wants the optimizer's slots made
        where the variables were. It runs in a thread of its own, whose distribution context is
        the default one."""
        keras_compat.in_own_thread(
            lambda: super(_LocalStagesMixin, self).compile(*args, **kwargs),
            "tfdist-pipeline-compile")

    def _adopt_optimizer(self) -> None:
        """Builds the optimizer now, eagerly: its slots then sit with their variables, on each
        stage's device (built inside ``fit``, they would not)."""
        optimizer = self.optimizer  # type: ignore[attr-defined]
        self._pipeline.check_optimizer(optimizer)
        keras_compat.bind_unbuilt_optimizer(optimizer, tf.distribute.get_strategy())
        optimizer.build(self.trainable_variables)  # type: ignore[attr-defined]

    def get_weights(self) -> list[Any]:
        """The stages' weights in the whole model's order (tf-keras would add the metrics')."""
        return [w for stage in self.pipeline_stages for w in stage.get_weights()]

    def set_weights(self, weights: Any) -> None:
        weights = list(weights)
        for stage in self.pipeline_stages:
            count = len(stage.weights)
            stage.set_weights(weights[:count])
            weights = weights[count:]

    def call(self, inputs: Any, training: Any = None) -> Any:
        for stage, device in zip(self.pipeline_stages, self.pipeline_devices, strict=True):
            with tf.device(device):
                inputs = stage(tf.nest.flatten(inputs), training=training)
        return inputs

    def stage_calls(self, training: bool) -> Any:
        """One call per stage."""
        return [functools.partial(lambda s, a: s(list(a), training=training), stage)
                for stage in self.pipeline_stages]

    def stage_variables(self) -> Any:
        """Each stage's trainable variables (in stage order they are ``trainable_variables``)."""
        return [list(stage.trainable_variables) for stage in self.pipeline_stages]

    def stage_loss_terms(self) -> Any:
        """Each stage's regularization losses."""
        return [loss_terms(stage) for stage in self.pipeline_stages]


@functools.cache
def stage_model_class(flavour: str) -> type:
    """The stage model class for Keras ``flavour``: ``_StageModelMixin`` over its functional
    model class (a stage is a functional sub-graph of the model, `tfdist.pipeline.stage`).

    Example:
        >>> from tfdist.core.flavour import keras_flavour
        >>> stage_model_class(keras_flavour()).__name__
        'PipelineStageModel'
    """
    return type("PipelineStageModel",
                (_StageModelMixin, keras_compat.functional_class(flavour)),  # type: ignore[arg-type]
                {})


def local_stages_model(flavour: str, stages: list[Any], devices: tuple[str, ...],
                       name: str) -> Any:
    """A model holding ``stages`` (built stage models, stage ``k`` on ``devices[k]``) whose
    steps run all K schedules in this process; call ``_init_pipeline`` on it next."""
    model = _local_model_class(flavour)(name=name)
    model.pipeline_stages = list(stages)
    model.pipeline_devices = tuple(devices)
    # Its stages are built; Keras 3's build() would also lock the model's state, and compile
    # still adds the pipeline's metrics.
    model.built = True
    return model


@functools.cache
def _local_model_class(flavour: str) -> type:
    keras = get_keras(flavour)  # type: ignore[arg-type]
    return type("PipelineLocalModel", (_LocalStagesMixin, keras.Model), {})
