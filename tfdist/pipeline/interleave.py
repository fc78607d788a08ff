"""Several model chunks per process (Megatron-LM's interleaved 1F1B): which pieces a process
holds, and how each chunk sees the pipeline.

The model is cut into ``K v`` pieces; process ``k`` holds pieces ``k, k + K, k + 2K, ...``
(`pieces`): its chunk ``c`` is piece ``c K + k``. Each chunk runs the same per-stage step code as
a process of a plain pipeline (a `tfdist.pipeline.engine.StageEngine`, one per chunk, in its
process engine's ``chunk_engines``), seeing the pipeline as ``K v`` stages in which it is stage
``c K + k`` (`ChunkLayout`): its activations go to the next piece (process ``k + 1``, or from
process ``K - 1`` back to process 0 for the next chunk) and its gradients come back the same
way. The process's engine runs the chunks' actions of the schedule in one loop, as it runs a
single stage's (`tfdist.pipeline.schedule.run_actions`).

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
from typing import Any

from tfdist.parallel.mesh import Axis, ProcessGroup
from tfdist.pipeline.layout import PipelineLayout
from tfdist.pipeline.transport import TRAIN

__all__ = ["pieces", "ChunkLayout", "ChunkLink"]

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
    (what a `tfdist.pipeline.engine.StageEngine` asks of its layout); groups and replicas are
    the process's."""

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
