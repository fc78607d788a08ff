"""Interleaved 1F1B in the engine: each of K processes holds v model chunks (Megatron-LM).

The model is cut into ``K v`` pieces; process ``k`` holds pieces ``k, k + K, k + 2K, ...``
(`pieces`): its chunk ``c`` is piece ``c K + k``. Each chunk runs the same per-stage step code as
a process of a plain pipeline (`tfdist.pipeline.engine.StageEngine`), seeing the pipeline as
``K v`` stages in which it is stage ``c K + k`` (`ChunkLayout`): its activations go to the next
piece (process ``k + 1``, or from process ``K - 1`` back to process 0 for the next chunk) and
its gradients come back the same way. `InterleavedPipeline` builds the chunks' ops in the order
of `tfdist.pipeline.schedule.interleaved`, chained so that the process runs them one at a time,
and returns every chunk's gradients (summed over micro-batches), applied once per step.

Two processes exchange several pieces' transfers over one pair group, so each edge of the
pipeline gets its own instance keys (`ChunkLink`): micro-batch ``m`` across the cut after piece
``p`` travels as micro-batch ``p M + m``.

Example:
    >>> pieces(stages=2, chunks=3, stage=1)
    (1, 3, 5)
    >>> layout = ChunkLayout(PipelineLayout(processes=2, stages=2, rank=1), chunk=0, chunks=2)
    >>> layout.stage, layout.stages, layout.previous, layout.next, layout.is_last
    (1, 4, 0, 0, False)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tfdist.parallel.mesh import Axis, ProcessGroup
from tfdist.pipeline import schedule as schedules
from tfdist.pipeline.engine import LossTerms, StageEngine, run_actions
from tfdist.pipeline.layout import PipelineLayout
from tfdist.pipeline.transport import EVALUATE, REDUCE, TRAIN, Link

__all__ = ["pieces", "ChunkLayout", "ChunkLink", "ChunkEngine", "InterleavedPipeline",
           "interleaved_engine"]

def pieces(stages: int, chunks: int, stage: int) -> tuple[int, ...]:
    """The pieces process ``stage`` holds: ``stage, stage + K, ...`` (Megatron's assignment).

    Example:
        >>> pieces(stages=2, chunks=2, stage=0)
        (0, 2)
    """
    return tuple(c * stages + stage for c in range(chunks))


@dataclasses.dataclass(frozen=True)
class ChunkLayout:
    """Chunk ``chunk`` of a process, seen as stage ``chunk K + k`` of a ``K v``-stage pipeline
    (what `StageEngine` asks of its layout); groups and replicas are the process's."""

    base: PipelineLayout
    chunk: int
    chunks: int

    @property
    def stages(self) -> int:
        return self.base.stages * self.chunks

    @property
    def stage(self) -> int:
        return self.chunk * self.base.stages + self.base.stage

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.stages - 1

    def _holder(self, piece: int) -> int:
        return self.base.rank_of(self.base.replica, piece % self.base.stages)

    @property
    def previous(self) -> int | None:
        return None if self.is_first else self._holder(self.stage - 1)

    @property
    def next(self) -> int | None:
        return None if self.is_last else self._holder(self.stage + 1)

    @property
    def replicas(self) -> int:
        return self.base.replicas

    @property
    def replica(self) -> int:
        return self.base.replica

    def pair(self, peer: int) -> ProcessGroup:
        return self.base.pair(peer)

    def group(self, axis: Axis) -> ProcessGroup:
        return self.base.group(axis)


@dataclasses.dataclass(frozen=True)
class ChunkLink:
    """A `Link` whose micro-batch ``m`` travels as ``offset + m``: the cut after piece ``p``
    uses ``offset = p M``, distinct for each edge two processes share."""

    link: Any
    offset: int

    def send(self, tensor: Any, kind: int, micro_batch: int = 0, index: int = 0,
             phase: int = TRAIN) -> Any:
        return self.link.send(tensor, kind, self.offset + micro_batch, index, phase)

    def recv(self, shape: Any, dtype: Any, kind: int, micro_batch: int = 0, index: int = 0,
             phase: int = TRAIN) -> Any:
        return self.link.recv(shape, dtype, kind, self.offset + micro_batch, index, phase)

    def send_sized(self, tensor: Any, kind: int, micro_batch: int = 0, index: int = 0,
                   phase: int = TRAIN) -> Any:
        return self.link.send_sized(tensor, kind, self.offset + micro_batch, index, phase)

    def recv_sized(self, shape: Any, dtype: Any, kind: int, micro_batch: int = 0,
                   index: int = 0, phase: int = TRAIN) -> Any:
        return self.link.recv_sized(shape, dtype, kind, self.offset + micro_batch, index, phase)


@dataclasses.dataclass(frozen=True)
class ChunkEngine(StageEngine):
    """`StageEngine` of one chunk (its layout a `ChunkLayout`): links keyed by their edge."""

    def _edge(self, peer: int | None, piece: int) -> ChunkLink | None:
        if peer is None:
            return None
        link = self.connect(self.layout.pair(peer), self.timeout)
        return ChunkLink(link, piece * self.micro_batches)

    @property
    def previous(self) -> ChunkLink | None:  # type: ignore[override]
        return self._edge(self.layout.previous, self.layout.stage - 1)

    @property
    def next(self) -> ChunkLink | None:  # type: ignore[override]
        return self._edge(self.layout.next, self.layout.stage)


@dataclasses.dataclass(frozen=True)
class InterleavedPipeline:
    """The v chunk engines of one process and its own engine (replicas, sharing): the
    pipeline's engine (`tfdist.pipeline.engine.PipelineEngine`) under interleaved 1F1B.

    Attributes:
        engines: Chunk ``c``'s engine (piece ``c K + k``).
        process: This process's engine as stage ``k`` of K (its layout, groups and sharing).
    """

    engines: tuple[ChunkEngine, ...]
    process: StageEngine

    @property
    def layout(self) -> PipelineLayout:
        return self.process.layout

    def ops(self) -> tuple[schedules.Action, ...]:
        """This process's actions ``(op, micro_batch, chunk)`` under its schedule."""
        layout = self.layout
        plan = schedules.schedule_class(self.process.schedule)(
            layout.stages, self.process.micro_batches, len(self.engines))
        return plan.actions(layout.stage)

    def train(self, calls: Sequence[Callable[[Any], Any]], variables: Sequence[Sequence[Any]],
              x: Any, y: Any, loss_fn: Any, sample_weight: Any = None,
              terms: Sequence[LossTerms | None] | None = None
              ) -> tuple[Any, list[Any], list[Any]]:
        """`StageEngine.train` over the chunks (``calls``, ``variables``, ``terms`` per chunk):
        the loss and outputs (on the last process), every chunk's gradients in chunk order."""
        terms = terms or [None] * len(self.engines)
        steps = [engine.begin(calls[c], variables[c], x, y, loss_fn, sample_weight, terms[c])
                 for c, engine in enumerate(self.engines)]
        run_actions(self.engines, steps, self.ops())
        results = [engine.finish(step) for engine, step in zip(self.engines, steps, strict=True)]
        loss, _, outputs = results[-1]
        grads = [g for _, chunk_grads, _ in results for g in chunk_grads]
        return loss, grads, outputs

    def forward(self, calls: Sequence[Callable[[Any], Any]], x: Any, phase: int = EVALUATE,
                terms: Sequence[LossTerms | None] | None = None) -> tuple[list[Any], Any]:
        """`StageEngine.forward` through the chunks in order; every chunk's sends are tied to
        the result."""
        terms = terms or [None] * len(self.engines)
        results = [engine.forward(calls[c], x, phase, terms[c])
                   for c, engine in enumerate(self.engines)]
        markers = [t for result in results[:-1] for t in tf.nest.flatten(result[0])]
        outs, carried = results[-1]
        if not self.layout.is_last:
            return [tf.group([*markers, *outs])], None
        with tf.control_dependencies(markers):
            return tf.nest.map_structure(tf.identity, outs), carried

    def replica_rows(self, tensor: Any) -> Any:
        return self.process.replica_rows(tensor)

    def average_over_replicas(self, tensors: Sequence[Any], kind: int = REDUCE,
                              phase: int = TRAIN) -> list[Any]:
        return self.process.average_over_replicas(tensors, kind, phase)

    def share(self, values: Any | None, shape: Any, dtype: Any, index: int = 0,
              phase: int = TRAIN, sized: bool = False) -> Any:
        return self.process.share(values, shape, dtype, index, phase, sized)


def interleaved_engine(process: StageEngine, chunks: int,
                       cuts: Sequence[Sequence[Any]]) -> InterleavedPipeline:
    """The interleaved engine of ``process`` (stage ``k`` of K) holding ``chunks`` chunks;
    ``cuts[p]``: the `BoundaryTensor`s the cut after piece ``p`` carries."""
    engines = []
    for c in range(chunks):
        layout = ChunkLayout(process.layout, c, chunks)
        p = layout.stage
        engines.append(ChunkEngine(
            layout=layout, inputs=tuple(cuts[p - 1]) if p > 0 else (),  # type: ignore[arg-type]
            outputs=tuple(cuts[p]) if p < len(cuts) else (),
            micro_batches=process.micro_batches, schedule=process.schedule,
            timeout=process.timeout, connect=Link, recompute=process.recompute))
    return InterleavedPipeline(tuple(engines), process)
