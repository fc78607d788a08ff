"""Which process holds which stages of which pipeline replica, and its collective groups.

A job of ``N = D x K`` processes (TF tasks ``worker:0..N-1``; ``rank`` is the task index) runs
``D`` pipeline replicas of ``K`` stages. Rank ``r`` holds stage ``r % K`` of replica ``r // K``:
the stages of one replica are neighbours in rank order, and ``worker:0`` (the chief) holds
stage 0 of replica 0. A process may instead hold all K stages, one per local device
(``stages_per_process=K``, `tfdist.pipeline.local`): its layout then has one replica, K stages,
and this one process holding them all.

The layout also answers "my group on this axis" (`group`: ``"pipe"``, the stages of my replica;
``"data"``, my stage's replicas), the pair of neighbours (`pair`) and the whole job (`world`),
as `tfdist.mesh.ProcessGroup` objects: the transport asks it for every key.

Example:
    >>> layout = PipelineLayout(processes=4, stages=2, rank=3)
    >>> layout.replicas, layout.replica, layout.stage, layout.previous, layout.next
    (2, 1, 1, 2, None)
    >>> layout.stage_group, layout.group("data").members, layout.group("data").rank
    ((1, 3), (1, 3), 1)
    >>> on_devices = PipelineLayout(processes=1, stages=3, rank=0, stages_per_process=3)
    >>> on_devices.held, on_devices.is_first, on_devices.is_last, on_devices.replicas
    (range(0, 3), True, True, 1)
"""

from __future__ import annotations

import dataclasses

from tfdist.errors import StrategyConfigError, format_error
from tfdist.mesh import (
    DATA,
    PIPE,
    Axis,
    ProcessGroup,
    axis_group,
    pair_group,
    world_group,
)
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
        processes: N = D x K / ``stages_per_process``.
        stages: K, the model's stages.
        rank: This process's index (its ``worker`` task index).
        stages_per_process: 1 (one stage per process), or K (one process holds every stage,
            one per local device).
    """

    processes: int
    stages: int
    rank: int
    stages_per_process: int = 1

    def __post_init__(self) -> None:
        check_stages(self.stages)
        if self.stages_per_process not in (1, self.stages):
            raise StrategyConfigError(format_error(
                "A process holds one stage or all of them.",
                received=f"stages_per_process={self.stages_per_process}, stages={self.stages}",
                expected=f"1 or {self.stages}", fix="pass 1, or stages"))
        check_processes(self.processes, self.processes_per_replica)
        if not 0 <= self.rank < self.processes:
            raise StrategyConfigError(format_error(
                "rank is out of range.", received=f"rank={self.rank}",
                expected=f"0 <= rank < {self.processes}", fix="pass this task's index"))

    @property
    def processes_per_replica(self) -> int:
        return self.stages // self.stages_per_process

    @property
    def replicas(self) -> int:
        """D: pipeline replicas (data parallelism across them)."""
        return self.processes // self.processes_per_replica

    @property
    def replica(self) -> int:
        return self.rank // self.processes_per_replica

    @property
    def held(self) -> range:
        """The stages this process holds."""
        first = self.rank % self.processes_per_replica * self.stages_per_process
        return range(first, first + self.stages_per_process)

    @property
    def stage(self) -> int:
        """The first stage this process holds (with one stage per process, its stage)."""
        return self.held.start

    @property
    def holds_all(self) -> bool:
        """Whether this process holds every stage of its replica."""
        return self.stages_per_process == self.stages

    @property
    def is_first(self) -> bool:
        return self.held.start == 0

    @property
    def is_last(self) -> bool:
        return self.held.stop == self.stages

    def rank_of(self, replica: int, stage: int) -> int:
        """The rank holding ``stage`` of ``replica``."""
        return replica * self.processes_per_replica + stage // self.stages_per_process

    @property
    def previous(self) -> int | None:
        """The rank holding the previous stage of this replica (None on the first stage)."""
        return None if self.is_first else self.rank - 1

    @property
    def next(self) -> int | None:
        """The rank holding the next stage of this replica (None on the last stage)."""
        return None if self.is_last else self.rank + 1

    @property
    def stage_group(self) -> tuple[int, ...]:
        """The ranks holding this stage in every replica (its gradients are averaged there)."""
        return tuple(self.rank_of(d, self.stage) for d in range(self.replicas))

    @property
    def replica_ranks(self) -> tuple[int, ...]:
        """The ranks holding this replica's stages, in stage order."""
        first = self.replica * self.processes_per_replica
        return tuple(range(first, first + self.processes_per_replica))

    # ----------------------------------------------------------------- groups
    def group(self, axis: Axis) -> ProcessGroup:
        """This process's group on ``axis``: ``"pipe"`` (its replica's stages; its rank there
        is its place in the pipeline) or ``"data"`` (its stage's replicas; its rank there is
        its replica)."""
        if axis == PIPE:
            return axis_group(PIPE, self.replica, self.replica_ranks, self.rank)
        if axis == DATA:
            index = self.rank % self.processes_per_replica
            return axis_group(DATA, index, self.stage_group, self.rank)
        raise StrategyConfigError(format_error(
            "Unknown pipeline axis.", received=f"axis={axis!r}",
            expected=f"{PIPE!r} or {DATA!r}", fix="ask for one of the pipeline's axes"))

    def pair(self, peer: int) -> ProcessGroup:
        """The group of this process and ``peer`` (a neighbouring stage's process)."""
        return pair_group(self.rank, peer)

    def world(self) -> ProcessGroup:
        """Every process of the job."""
        return world_group(self.processes, self.rank)
