"""The Keras 3 model a ZeRO process trains: the user's model, its steps replaced by ZeRO's.

`attach` turns a built model into a ZeRO model in place: its class becomes a subclass of its own
class and `ZeroModelMixin` (kept per class, so a functional, ``Sequential`` or subclassed model
keeps its behaviour), with a `tfdist.zero.engine.ZeroEngine`. `original_class` is what saving
writes (`tfdist.strategies.zero.ZeroStrategy.save_model` swaps it back for the write).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf

from tfdist.compat.models import clipping_off
from tfdist.parallel.ops import all_reduce
from tfdist.watchdog import StepWatchdog, with_deadline
from tfdist.zero.engine import ZeroEngine
from tfdist.zero.layerwise import layerwise, scattering

__all__ = ["ZeroModelMixin", "attach", "original_class", "train_step"]

_CLASSES: dict[type, type] = {}


def replica_rows(value: Any, rank: int, size: int) -> Any:
    """Rows ``[n d // D, n (d + 1) // D)`` of every tensor of ``value`` (replica ``d`` of D)."""
    if value is None or size == 1:
        return value

    def rows(t: Any) -> Any:
        n = tf.shape(t)[0]
        return t[n * rank // size:n * (rank + 1) // size]

    return tf.nest.map_structure(rows, value)


def replica_share(x: Any, rank: int, size: int) -> Any:
    """D x this replica's share of the batch's rows: its mean loss times this, averaged over
    the D replicas, is the global batch's mean."""
    n = tf.shape(tf.nest.flatten(x)[0])[0]
    if size == 1:
        return tf.constant(1.0)
    with tf.control_dependencies([tf.debugging.assert_greater_equal(
            n, size, message=f"A global batch has fewer rows than the {size} data-parallel "
            "processes of ZeRO. Fix: batch at least that many rows (drop_remainder=True)")]):
        rows = n * (rank + 1) // size - n * rank // size
    return tf.cast(rows * size, tf.float32) / tf.cast(n, tf.float32)


@contextlib.contextmanager
def whole_weights(engine: ZeroEngine, whole: list[Any] | None) -> Iterator[None]:
    """Stage 3: the model runs on ``whole`` (gathered tensors) in place of its variables; the
    non-trainable variables a call updates (batch statistics, seeds) are written back after."""
    if whole is None:
        yield
        return
    with keras.StatelessScope(state_mapping=list(zip(engine.variables, whole,
                                                     strict=True))) as scope:
        yield
    trainable = {id(v) for v in engine.variables}
    for variable in engine.model.variables:
        if id(variable) not in trainable:
            value = scope.get_current_value(variable)
            if value is not None:
                variable.assign(value)


def train_step(model: Any, data: Any) -> Any:
    """One ZeRO step of ``model`` on the global batch ``data`` (see `tfdist.zero.engine`)."""
    engine: ZeroEngine = model.zero_engine
    group, optimizer = engine.group, model.optimizer
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    rows = tf.shape(tf.nest.flatten(x)[0])[0]
    share = replica_share(x, group.rank, group.size)
    x, y, sample_weight = (replica_rows(v, group.rank, group.size) for v in (x, y, sample_weight))
    if engine.units is not None:
        pieces, y_pred, loss = _unit_gradients(model, engine, x, y, sample_weight, share)
    else:
        pieces, y_pred, loss = _whole_gradients(model, engine, x, y, sample_weight, share)
    pieces = engine.clip_pieces(pieces, optimizer)
    with clipping_off(optimizer):
        optimizer.apply_gradients(zip(pieces, engine.pieces, strict=True))
    if engine.stage < 3 and engine.sabotage != "skip_gather":
        for variable, value in zip(engine.variables, engine.gather_whole(), strict=True):
            variable.assign(value)
    if group.size > 1:
        loss = all_reduce(loss, group, "sum") / group.size
    model._loss_tracker.update_state(loss, sample_weight=rows)  # noqa: SLF001
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def _unit_gradients(model: Any, engine: ZeroEngine, x: Any, y: Any, sample_weight: Any,
                    share: Any) -> tuple[list[Any], Any, Any]:
    """Stages 2 and 3 on a model whose weights all sit in units (`tfdist.zero.layerwise`):
    this process's pieces' gradients, already summed onto it, the predictions and the loss.
    Stage 3 gathers each unit's weights just before its forward and its backward
    (`layerwise`); stage 2 runs the whole weights and reduce-scatters each unit's gradient as
    soon as it is complete (`scattering`)."""
    found = engine.units or []
    with tf.GradientTape() as tape:  # scattering's identities are recorded by the tape
        with (layerwise(engine, found) if engine.stage == 3
              else whole_weights(engine, scattering(engine, found))):
            y_pred = model(x, training=True)
            loss = model._compute_loss(x=x, y=y, y_pred=y_pred,  # noqa: SLF001
                                       sample_weight=sample_weight, training=True)
        loss = loss * tf.cast(share, loss.dtype)
    targets = [piece.value for piece in engine.pieces] + [unit.token for unit in found]
    gradients = tape.gradient(loss, targets)
    return list(gradients[:len(engine.pieces)]), y_pred, loss


def _whole_gradients(model: Any, engine: ZeroEngine, x: Any, y: Any, sample_weight: Any,
                     share: Any) -> tuple[list[Any], Any, Any]:
    """The whole local gradients (stage 3: on the whole weights gathered at once), summed onto
    their owners: this process's pieces' gradients, the predictions and the loss."""
    whole = engine.gather_whole() if engine.stage == 3 else None
    with tf.GradientTape() as tape:
        if whole is not None:
            tape.watch(whole)
        with whole_weights(engine, whole):
            y_pred = model(x, training=True)
            loss = model._compute_loss(x=x, y=y, y_pred=y_pred,  # noqa: SLF001
                                       sample_weight=sample_weight, training=True)
        loss = loss * tf.cast(share, loss.dtype)
    gradients = tape.gradient(loss, whole if whole is not None else engine.variables)
    return engine.reduce_to_owners(gradients), y_pred, loss


class ZeroModelMixin:
    """The steps of a ZeRO model; mixed in before the model's own class by `attach`."""

    zero_engine: ZeroEngine
    zero_watchdog: StepWatchdog

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        """Keras's ``fit``, with the step deadline and the optimizer built on this process's
        pieces (its slots: 1/D of the model's)."""
        args, kwargs = with_deadline(args, kwargs, 5, self.zero_watchdog)
        self.zero_engine.build_optimizer(self.optimizer)  # type: ignore[attr-defined]
        return super().fit(*args, **kwargs)  # type: ignore[misc]

    def train_step(self, data: Any) -> Any:
        return train_step(self, data)

    def save_weights(self, *args: Any, **kwargs: Any) -> Any:
        """Keras's, with this process's optimizer slots (a per-process backup's): stage 3
        gathers the whole weights for it (every process saves at once, as its backup does)."""
        engine = self.zero_engine
        if engine.stage == 3:
            engine.materialize()
        try:
            return super().save_weights(*args, **kwargs)  # type: ignore[misc]
        finally:
            if engine.stage == 3:
                engine.drop_whole()

    def load_weights(self, *args: Any, **kwargs: Any) -> Any:
        """Keras's, then this process's pieces taken from the loaded weights (no collective)."""
        engine = self.zero_engine
        if engine.dropped:
            engine.allocate_whole()
        try:
            result = super().load_weights(*args, **kwargs)  # type: ignore[misc]
            engine.take_pieces()
        finally:
            if engine.stage == 3:
                engine.drop_whole()
        return result

    def test_step(self, data: Any) -> Any:
        engine = self.zero_engine
        whole = engine.gather_whole() if engine.stage == 3 else None
        with whole_weights(engine, whole):
            return super().test_step(data)  # type: ignore[misc]

    def predict_step(self, data: Any) -> Any:
        engine = self.zero_engine
        whole = engine.gather_whole() if engine.stage == 3 else None
        with whole_weights(engine, whole):
            return super().predict_step(data)  # type: ignore[misc]


def attach(model: Any, engine: ZeroEngine, watchdog: StepWatchdog) -> Any:
    """``model`` as a ZeRO model (its class swapped in place; weights and layers unchanged)."""
    cls = type(model)
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Zero{cls.__name__}", (ZeroModelMixin, cls),
                             {"_tfdist_original_class": cls})
    model.__class__ = _CLASSES[cls]
    model.zero_engine, model.zero_watchdog = engine, watchdog
    return model


def original_class(model: Any) -> type:
    """The class ``model`` had before `attach` (its own class if never attached)."""
    return getattr(type(model), "_tfdist_original_class", type(model))
