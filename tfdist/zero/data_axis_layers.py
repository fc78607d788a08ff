"""ZeRO stage 3 on the data axis of the pipeline and tensor strategies: each of a stage's (or
tensor shard's) D replicas keeps 1/D of its weights, and gathers each layer's weights just
before that layer runs.

`DataAxisLayers` is `tfdist.zero.data_axis.DataAxisZero` at stage 3 on one pipeline stage, or on
one tensor shard (its layers' local shards split over D; a split layer's own collectives over
the tensor group run inside its call, so also again in its backward's recompute). Its
collectives are those of multi_worker's stage 3 (`tfdist.zero.engine.ZeroEngine` on the stage
model, `tfdist.zero.layerwise`), over the stage's data group: each layer is cut into D parts of
its own (`tfdist.zero.partition.partition_groups`), the stage model's trainable variables hold no
values between steps, and while the step is traced (`layerwise`) each layer's ``call``:

* forward, per micro-batch: all-gathers the layer's weights, runs, drops them;
* backward, per micro-batch: all-gathers them again, recomputes the layer's forward under a
  tape, reduce-scatters the weights' gradient to their owners (averaged over the D replicas),
  drops the weights and the whole gradient.

The step (the pipeline engine, or the tensor shard's ``apply_step``) differentiates by this
process's pieces and the layers' tokens (`targets`) instead of the model's variables, so the sums
the pipeline keeps over the micro-batches are the pieces' (1/D). With M micro-batches (1 on the
tensor strategy) a step gathers each layer 2 M times and reduce-scatters it M times (3 M
collectives per layer, against one all-reduce per weight replicated): the weights
move ``2 M (D-1)/D`` times their bytes per step, the gradients ``M (D-1)/D``. A gathered layer
lives for one layer's forward or backward: peak weight memory is 1/D of the stage plus the
largest layer (plus, in the backward, its whole gradient before the reduce-scatter).

Then `apply` clips (``clipnorm`` per whole weight, ``global_clipnorm`` over every part and every
stage, as stages 1 and 2) and the optimizer, built on the pieces, updates them; nothing is
gathered after the update. Evaluate and predict run under `layerwise` too (forward gathers only);
saving and ``gather_weights`` (and the pipeline stage's ``save_weights``) gather the stage or
shard whole for the call (`whole`) and drop it after; a per-process backup
(``strategy.backup_callback``) checkpoints this process's pieces, the optimizer built on them
and the model's other variables (`tfdist.resilience.pipeline_backup.backup_objects`).

Refused before training (`check_pipeline_stage3` and the constructor): interleaved chunks,
every stage in one process, the ``zb-h1`` schedule (its split backward would run each layer's
backward, and its collectives, twice), ``weight_gradients="whole_batch"``, tied weights
(`check_zero_optimizer`), weight regularizers (they read the whole weights outside any layer's
call) and a stage whose weights are not all inside its layers.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tensorflow as tf

from tfdist.errors import StrategyConfigError, format_error
from tfdist.parallel.mesh import ProcessGroup
from tfdist.zero.data_axis import DataAxisZero
from tfdist.zero.layerwise import layerwise

__all__ = ["DataAxisLayers", "check_pipeline_stage3", "SPLIT_BACKWARD_SCHEDULES"]

SPLIT_BACKWARD_SCHEDULES = ("zb-h1",)
"""Schedules whose backward runs as two ops (input, then weight gradients)."""


def check_pipeline_stage3(schedule: str, chunks: int, weight_gradients: str,
                          holds_several: bool) -> None:
    """Refuses, before any process waits for another, a pipeline ZeRO stage 3 cannot run.

    Example:
        >>> check_pipeline_stage3("1f1b", 1, "sum", holds_several=False)
        >>> check_pipeline_stage3("zb-h1", 1, "sum", holds_several=False)
        Traceback (most recent call last):
        ...
        tfdist.errors.StrategyConfigError: ZeRO stage 3 gathers each layer in its backward, \
and the zb-h1 schedule splits a backward in two ops, which would run each layer's backward \
(its gathers and reduce-scatter) twice. Received: zero=3 with schedule='zb-h1'. Expected: \
schedule 'gpipe' or '1f1b' with zero=3. Fix: pass schedule='1f1b', or zero=2
    """
    if schedule in SPLIT_BACKWARD_SCHEDULES:
        raise StrategyConfigError(format_error(
            "ZeRO stage 3 gathers each layer in its backward, and the "
            f"{schedule} schedule splits a backward in two ops, which would run each layer's "
            "backward (its gathers and reduce-scatter) twice.",
            received=f"zero=3 with schedule={schedule!r}",
            expected="schedule 'gpipe' or '1f1b' with zero=3",
            fix="pass schedule='1f1b', or zero=2"))
    if chunks > 1 or holds_several:
        raise StrategyConfigError(format_error(
            "ZeRO stage 3 on the pipeline runs one stage per process.",
            received=f"zero=3 with chunks={chunks}"
                     + (", every stage in one process" if holds_several else ""),
            expected="chunks=1 and one process per stage (processes = D x K)",
            fix="drop chunks (and devices), or use zero=2"))
    if weight_gradients != "sum":
        raise StrategyConfigError(format_error(
            "ZeRO stage 3 reduce-scatters each micro-batch's weight gradients as they come; "
            "weight_gradients='whole_batch' would run the stage again on whole weights.",
            received=f"zero=3 with weight_gradients={weight_gradients!r}",
            expected="weight_gradients='sum' with zero=3",
            fix="drop weight_gradients, or use zero=2"))


def _refuse_regularizers(model: Any) -> None:
    found = [f"{layer.name}.{attribute}" for layer in model._flatten_layers()  # noqa: SLF001
             for attribute in ("kernel_regularizer", "bias_regularizer",
                               "embeddings_regularizer", "depthwise_regularizer",
                               "recurrent_regularizer", "gamma_regularizer",
                               "beta_regularizer")
             if getattr(layer, attribute, None) is not None]
    if found:
        raise StrategyConfigError(format_error(
            "ZeRO stage 3 keeps no whole weights between layer calls, and a weight "
            "regularizer is computed on the whole weights once per step outside them.",
            received=f"zero=3 with weight regularizers {found}",
            expected="no weight regularizers with zero=3 (activity regularizers are fine)",
            fix="drop the regularizers (or use AdamW's weight_decay), or use zero=2"))


class DataAxisLayers(DataAxisZero):
    """ZeRO stage 3 on one pipeline stage's (or tensor shard's) ``model``, over its data group
    (see the module).

    Args:
        model: The stage or shard model (built, weights already equal on the D replicas).
        group: Its data group (D replicas).
        pipe: The replica's pipeline group, for ``global_clipnorm``; None: none.
        tensor: The tensor group over which the ``split`` weights are spread (the tensor
            strategy); None: none.
        split: Indexes (in the model's trainable weights) of the weights split over ``tensor``.
        timeout: Seconds an eager collective waits.
        sabotage: Test-only: ``"skip_scatter"`` keeps each replica's own gradient instead of
            reduce-scattering it (parity must then fail).
    """

    def __init__(self, model: Any, group: ProcessGroup, pipe: ProcessGroup | None = None,
                 tensor: ProcessGroup | None = None, split: frozenset[int] = frozenset(),
                 timeout: float = 0.0, sabotage: str | None = None) -> None:
        from tfdist.zero.engine import ZeroEngine

        _refuse_regularizers(model)
        if not model.trainable_variables:
            raise StrategyConfigError(format_error(
                "ZeRO stage 3 shards a stage's (shard's) weights, and this one has none to "
                "shard (a stage of weightless layers).",
                received=f"zero=3 on {model.name!r} with 0 trainable weights",
                expected="trainable weights in every stage with zero=3",
                fix="move the split points so that every stage holds a layer with weights, "
                    "or use zero=2"))
        self.engine = ZeroEngine(model, 3, group, timeout, sabotage)
        if self.engine.units is None:
            self.engine.materialize()  # every replica, as it was: nothing was sharded yet
            raise StrategyConfigError(format_error(
                "ZeRO stage 3 gathers a stage layer by layer, and a weight of this stage "
                "belongs to no layer (or to two).",
                received=f"zero=3 on a stage model {model.name!r} with weights outside its "
                         "layers",
                expected="every trainable weight inside one layer of the stage",
                fix="move the weight into a layer, or use zero=2"))
        self.variables, self.stage, self.group, self.pipe = self.engine.variables, 3, group, pipe
        self.tensor, self.split = tensor, split if tensor is not None and tensor.size > 1 \
            else frozenset()
        self.timeout, self.sabotage = timeout, sabotage
        self.dtype = tf.as_dtype(self.engine.dtype)
        self.plan, self.mine = self.engine.plan, self.engine.mine
        self.longest, self.pieces = self.engine.longest, self.engine.pieces

    # ----------------------------------------------------------------- the step
    def targets(self) -> list[Any]:
        """What the step differentiates: this process's pieces, then each layer's token (their
        gradients: the pieces', summed onto them; the tokens', zeros)."""
        return [p.value for p in self.pieces] + [u.token for u in self.engine.units or []]

    def layerwise(self) -> contextlib.AbstractContextManager[None]:
        """While entered (the step's trace), each layer gathers its weights for its calls."""
        return layerwise(self.engine, self.engine.units or [])

    def apply(self, optimizer: Any, gradients: Sequence[Any],
              average: Callable[[list[Any]], list[Any]] | None = None,
              combine: Callable[[list[Any]], list[Any]] | None = None) -> None:
        """Updates this process's pieces from their ``gradients`` (`targets`' first ones,
        already summed over the data axis and the micro-batches); nothing is gathered after."""
        from tfdist.compat.models import clipping_off

        del average, combine  # the gradients are already the pieces' (tied weights refused)
        owned = self._clip(list(gradients)[:len(self.pieces)], optimizer)
        with clipping_off(optimizer):
            optimizer.apply_gradients(zip(owned, self.pieces, strict=True))

    # ----------------------------------------------------------------- whole
    @contextlib.contextmanager
    def whole(self) -> Iterator[None]:
        """The stage's weights whole (gathered; a collective of the D replicas) while
        entered, dropped after."""
        self.engine.materialize()
        try:
            yield
        finally:
            self.engine.drop_whole()

    @contextlib.contextmanager
    def loading(self) -> Iterator[None]:
        """Room for the whole weights while entered (no collective); this process's pieces
        are then taken from them and the weights dropped."""
        self.engine.allocate_whole()
        try:
            yield
            self.engine.take_pieces()
        finally:
            self.engine.drop_whole()

    def held_bytes(self, optimizer: Any) -> dict[str, int]:
        """As `DataAxisZero.held_bytes`, with ``weights``: the bytes the stage model's
        trainable variables hold (0 between steps) and ``largest_layer``: the most one layer
        gathers at once."""
        itemsize = self.dtype.size
        largest = max((sum(math.prod(self.plan.shapes[i]) for i in unit.variables)
                       for unit in self.engine.units or []), default=0)
        return {**super().held_bytes(optimizer),
                "weights": self.engine.held_bytes()["weights"],
                "largest_layer": largest * itemsize}
