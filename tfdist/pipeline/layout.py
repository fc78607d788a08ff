"""Which process holds which stage of which pipeline replica. Pure functions.

A job of ``N = D x K`` processes (TF tasks ``worker:0..N-1``; ``rank`` is the task index) runs
``D`` pipeline replicas of ``K`` stages. Rank ``r`` holds stage ``r % K`` of replica ``r // K``:
the stages of one replica are neighbours in rank order, and ``worker:0`` (the chief) holds
stage 0 of replica 0.

Example:
    >>> layout = PipelineLayout(processes=4, stages=2, rank=3)
    >>> layout.replicas, layout.replica, layout.stage, layout.previous, layout.next
    (2, 1, 1, 2, None)
    >>> layout.stage_group
    (1, 3)
"""

from __future__ import annotations

import dataclasses

from tfdist.errors import StrategyConfigError, format_error
from tfdist.pipeline.partition import check_stages

__all__ = ["PipelineLayout", "check_processes"]


def check_processes(processes: int, stages: int) -> int:
    """The number of pipeline replicas ``D = processes / stages``; raises unless it divides.

    Example:
        >>> check_processes(6, 3)
        2
    """
    check_stages(stages)
    if processes < stages or processes % stages:
        low = max(stages, processes - processes % stages)
        raise StrategyConfigError(format_error(
            f"{processes} process(es) cannot hold whole pipelines of {stages} stages.",
            received=f"processes={processes}, stages={stages}",
            expected=f"a multiple of {stages} (D replicas x {stages} stages)",
            fix=f"use --workers {low} (or {low + stages}), or --stages that divides "
            f"{processes}"))
    return processes // stages


@dataclasses.dataclass(frozen=True)
class PipelineLayout:
    """Where process ``rank`` sits in a job of ``processes`` processes and ``stages`` stages.

    Attributes:
        processes: N = D x K.
        stages: K.
        rank: This process's index (its ``worker`` task index).
    """

    processes: int
    stages: int
    rank: int

    def __post_init__(self) -> None:
        check_processes(self.processes, self.stages)
        if not 0 <= self.rank < self.processes:
            raise StrategyConfigError(format_error(
                "rank is out of range.", received=f"rank={self.rank}",
                expected=f"0 <= rank < {self.processes}", fix="pass this task's index"))

    @property
    def replicas(self) -> int:
        """D: pipeline replicas (data parallelism across them)."""
        return self.processes // self.stages

    @property
    def stage(self) -> int:
        return self.rank % self.stages

    @property
    def replica(self) -> int:
        return self.rank // self.stages

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.stages - 1

    def rank_of(self, replica: int, stage: int) -> int:
        """The rank holding ``stage`` of ``replica``."""
        return replica * self.stages + stage

    @property
    def previous(self) -> int | None:
        """The rank of the previous stage of this replica (None on the first stage)."""
        return None if self.is_first else self.rank - 1

    @property
    def next(self) -> int | None:
        """The rank of the next stage of this replica (None on the last stage)."""
        return None if self.is_last else self.rank + 1

    @property
    def stage_group(self) -> tuple[int, ...]:
        """The ranks holding this stage in every replica (its gradients are averaged there)."""
        return tuple(self.rank_of(d, self.stage) for d in range(self.replicas))

    @property
    def replica_ranks(self) -> tuple[int, ...]:
        """The ranks of this replica's stages, in stage order."""
        return tuple(self.rank_of(self.replica, k) for k in range(self.stages))
