"""Which process holds which stages of which pipeline replica, and its collective groups.

A job of ``N = D x K x T`` processes (TF tasks ``worker:0..N-1``; ``rank`` is the task index)
runs ``D`` pipeline replicas of ``K`` stages, each stage split ``T`` ways by tensor parallelism
(``T = 1``: no split). The layout is a place on a `tfdist.parallel.mesh.Mesh` (a
`tfdist.parallel.place.MeshPlace`) seen as a pipeline: rank ``r`` sits at
the mesh coordinates ``(replica, stage, shard)``, ``r = (replica * K + stage) * T + shard``, so
with ``T = 1`` it holds stage ``r % K`` of replica ``r // K``: the stages of one replica are
neighbours in rank order, and ``worker:0`` (the chief) holds stage 0 of replica 0. A process may
instead hold all K stages, one per local device (``stages_per_process=K``,
`tfdist.pipeline.local`): its layout then has one replica, K stages, and this one process holding
them all (its mesh has a ``pipe`` axis of 1).

The layout answers "my group on this axis" (`group`: ``"pipe"``, the stages of my replica;
``"data"``, my stage's replicas; ``"tensor"``, my stage's shards), the pair of neighbours
(`pair`) and the whole job (`world`) by asking its place: the transport gets every group key
from here, and no key is made anywhere else.

Example:
    >>> layout = PipelineLayout(processes=4, stages=2, rank=3)
    >>> layout.replicas, layout.replica, layout.stage, layout.previous, layout.next
    (2, 1, 1, 2, None)
    >>> layout.stage_group, layout.group("data").members, layout.group("data").rank
    ((1, 3), (1, 3), 1)
    >>> on_devices = PipelineLayout(processes=1, stages=3, rank=0, stages_per_process=3)
    >>> on_devices.held, on_devices.is_first, on_devices.is_last, on_devices.replicas
    (range(0, 3), True, True, 1)
    >>> split = PipelineLayout(processes=8, stages=2, rank=5, tensor=2)
    >>> split.coordinates, split.previous, split.group("tensor").members
    (Coordinates(data=1, pipe=0, tensor=1), None, (4, 5))
    >>> split.next, split.stage_group
    (7, (1, 5))
"""

from __future__ import annotations

import dataclasses
import functools

from tfdist.errors import StrategyConfigError, format_error
from tfdist.parallel.mesh import DATA, PIPE, Axis, Coordinates, Mesh, ProcessGroup
from tfdist.parallel.place import MeshPlace, place_of
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
        processes: N = D x K x T / ``stages_per_process``.
        stages: K, the model's stages.
        rank: This process's index (its ``worker`` task index).
        stages_per_process: 1 (one stage per process), or K (one process holds every stage,
            one per local device).
        tensor: T, the tensor-parallel shards of each stage (1: none).
    """

    processes: int
    stages: int
    rank: int
    stages_per_process: int = 1
    tensor: int = 1

    def __post_init__(self) -> None:
        check_stages(self.stages)
        if self.stages_per_process not in (1, self.stages):
            raise StrategyConfigError(format_error(
                "A process holds one stage or all of them.",
                received=f"stages_per_process={self.stages_per_process}, stages={self.stages}",
                expected=f"1 or {self.stages}", fix="pass 1, or stages"))
        check_processes(self.processes, self.stages // self.stages_per_process)
        if not 0 <= self.rank < self.processes:
            raise StrategyConfigError(format_error(
                "rank is out of range.", received=f"rank={self.rank}",
                expected=f"0 <= rank < {self.processes}", fix="pass this task's index"))
        self.place  # noqa: B018 - built once, now: raises unless K x T divides the processes

    @functools.cached_property
    def place(self) -> MeshPlace:
        """This process on the job's mesh of ``replicas x processes-per-pipeline x tensor``
        (its ``pipe`` axis is 1 when one process holds every stage)."""
        return place_of(self.processes, self.rank, pipe=self.stages // self.stages_per_process,
                        tensor=self.tensor)

    @property
    def mesh(self) -> Mesh:
        """The job's processes (`place`'s mesh)."""
        return self.place.mesh

    @property
    def coordinates(self) -> Coordinates:
        """This process's place on the mesh: (replica, its place in the pipeline, its shard)."""
        return self.place.coordinates

    @property
    def processes_per_replica(self) -> int:
        """The processes of one pipeline replica (its stages, each on ``tensor`` processes)."""
        return self.mesh.pipe * self.tensor

    @property
    def replicas(self) -> int:
        """D: pipeline replicas (data parallelism across them)."""
        return self.mesh.data

    @property
    def replica(self) -> int:
        return self.place.rank_on(DATA)

    @property
    def held(self) -> range:
        """The stages this process holds."""
        first = self.coordinates.pipe * self.stages_per_process
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
        """The rank holding ``stage`` of ``replica`` (this process's shard of it)."""
        return self.mesh.rank_of(replica, stage // self.stages_per_process,
                                 self.coordinates.tensor)

    @property
    def previous(self) -> int | None:
        """The rank holding the previous stage of this replica (None on the first stage)."""
        return None if self.is_first else self.rank_of(self.replica, self.stage - 1)

    @property
    def next(self) -> int | None:
        """The rank holding the next stage of this replica (None on the last stage)."""
        return None if self.is_last else self.rank_of(self.replica, self.held.stop)

    @property
    def stage_group(self) -> tuple[int, ...]:
        """The ranks holding this stage (shard) in every replica (its gradients are averaged
        there)."""
        return self.place.group(DATA).members

    @property
    def replica_ranks(self) -> tuple[int, ...]:
        """The ranks holding this replica's stages (this shard of each), in stage order."""
        return self.place.group(PIPE).members

    # ----------------------------------------------------------------- groups
    def group(self, axis: Axis) -> ProcessGroup:
        """This process's group on ``axis`` (`tfdist.parallel.place.MeshPlace.group`):
        ``"pipe"`` (its replica's stages; its rank there is its place in the pipeline),
        ``"data"`` (its stage's replicas; its rank there is its replica) or ``"tensor"`` (its
        stage's shards)."""
        return self.place.group(axis)

    def pair(self, peer: int) -> ProcessGroup:
        """The group of this process and ``peer`` (a neighbouring stage's process)."""
        return self.place.pair(peer)

    def world(self) -> ProcessGroup:
        """Every process of the job."""
        return self.place.world()
