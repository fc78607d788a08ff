"""The job's processes on named axes (data x pipe x tensor), and the collective group of each.

A job of ``N = D x K x T`` processes (TF tasks ``worker:0..N-1``; ``rank`` is the task index) is
a `Mesh`: ``D`` data-parallel replicas of a model cut into ``K`` pipeline stages, each stage's
operators split ``T`` ways (tensor parallelism). Rank order puts ``tensor`` fastest, then
``pipe``, then ``data``: ``rank = (d * K + p) * T + t``. So a tensor group (the processes that
hold shards of the same layers and all-reduce activations at every block) is ``T`` neighbouring
ranks, which the launcher places on one host; a pipeline replica's stages follow each other; and
``worker:0`` (the chief) is ``(0, 0, 0)``.

Each process belongs to one group per axis (the processes that differ from it only along that
axis) and has a rank on it; `Mesh.group` names it as a `ProcessGroup` with TensorFlow's
collective ``group_key``. Besides, each pair of processes has a group of two (sends and
receives between neighbouring stages), and the whole job is one group (barriers). Every tfdist
component that runs collectives (the pipeline's transport, the tensor layers, the data axis's
gradient average) asks the mesh or these functions for its group keys and never makes one itself
(instance keys: `tfdist.parallel.keys`).

Keys (unique per group in the job):

* axis ``a``'s ``i``-th group: ``AXIS_KEY_BASE[a] + i``, where ``i`` numbers the groups of the
  axis by the other two coordinates in rank order (for ``"data"``: ``p * T + t``; for
  ``"pipe"``: ``d * T + t``; for ``"tensor"``: ``d * K + p``). With ``T = 1`` these are the
  pipeline's keys of old (the stage for ``"data"``, the replica for ``"pipe"``);
* the pair of ranks ``a < b``: ``PAIR_KEY_BASE + a * MAX_RANKS + b``;
* the whole job: ``WORLD_KEY``.

How a task learns its place: ``tfdist-launch`` writes the mesh's shape into every task's
environment as ``TFDIST_MESH="data=2,pipe=1,tensor=2"`` (`MESH_ENV`, `Mesh.to_env`), and each
task's rank is its place in TF_CONFIG's training tasks (the chief, if any, is rank 0, then the
workers in index order). `Mesh.from_environment` reads both back; the strategies ask
`tfdist.parallel.place.process_place`, which reads it once per process.

TensorFlow-free.

Example:
    >>> mesh = Mesh(data=2, pipe=2, tensor=2)
    >>> mesh.size, mesh.coordinates(5), mesh.rank_of(data=1, pipe=0, tensor=1)
    (8, Coordinates(data=1, pipe=0, tensor=1), 5)
    >>> mesh.group("tensor", rank=5).members, mesh.group("pipe", 5).members
    ((4, 5), (5, 7))
    >>> mesh.group("data", 5).members, mesh.group("data", 5).rank
    ((1, 5), 1)
    >>> Mesh.for_processes(8, pipe=2, tensor=2).data
    2
    >>> group = axis_group("data", index=1, members=(1, 3), rank=3)
    >>> group.key, group.size, group.rank
    (524289, 2, 1)
    >>> pair_group(3, 2).key, pair_group(3, 2).peer
    (1056771, 2)
    >>> Mesh(data=2, tensor=2).to_env(), Mesh.parse("pipe=2,tensor=2")
    ('data=2,pipe=1,tensor=2', Mesh(data=1, pipe=2, tensor=2))
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal, NamedTuple

from tfdist.core import traits as builtin
from tfdist.core.environ import peek_tf_config
from tfdist.errors import StrategyConfigError, format_error

__all__ = ["Axis", "AXES", "DATA", "PIPE", "TENSOR", "Coordinates", "Mesh", "ProcessGroup",
           "axis_group", "pair_group", "world_group", "MAX_RANKS", "MESH_ENV", "TRAINING_ROLES",
           "task_rank"]

Axis = Literal["data", "pipe", "tensor"]
"""A mesh axis: data parallelism, pipeline stages, tensor (intra-operator) shards."""
DATA: Axis = "data"
PIPE: Axis = "pipe"
TENSOR: Axis = "tensor"
AXES: tuple[Axis, ...] = (DATA, PIPE, TENSOR)
"""The axes, slowest-varying first in rank order."""

MAX_RANKS = 4096
PAIR_KEY_BASE = 1 << 20
AXIS_KEY_BASE: Mapping[str, int] = MappingProxyType(
    {DATA: 1 << 19, PIPE: 1 << 18, TENSOR: 1 << 16})
WORLD_KEY = 1 << 17

MESH_ENV = builtin.MESH_ENV
"""Set by ``tfdist-launch`` on every task of a job laid out on a mesh: its shape, as
``"data=2,pipe=1,tensor=2"`` (`Mesh.to_env`), when ``--stages`` or ``--tensor`` shaped it (a
strategy takes them by naming them in its ``traits.launch_options``)."""

TRAINING_ROLES = ("chief", "worker")
"""The TF_CONFIG roles on the mesh, in rank order (the chief, if any, is rank 0)."""


@dataclasses.dataclass(frozen=True)
class ProcessGroup:
    """A collective group and this process's place in it.

    Attributes:
        key: TensorFlow's collective ``group_key`` of the group.
        members: The job ranks in the group, in the axis's order.
        rank: This process's position in ``members`` (its rank on the axis).

    Example:
        >>> ProcessGroup(key=7, members=(4, 5, 6), rank=2).size
        3
    """

    key: int
    members: tuple[int, ...]
    rank: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < len(self.members):
            raise StrategyConfigError(format_error(
                "A process is not a member of its own group.",
                received=f"rank={self.rank}, members={self.members}",
                expected=f"0 <= rank < {len(self.members)}",
                fix="this is a tfdist bug: report it with the job's layout"))

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def peer(self) -> int:
        """The other member's job rank (a group of two only)."""
        if self.size != 2:
            raise StrategyConfigError(format_error(
                "Only a group of two has one peer.", received=f"members={self.members}",
                expected="two members", fix="this is a tfdist bug: report it"))
        return self.members[1 - self.rank]


def axis_group(axis: Axis, index: int, members: tuple[int, ...], rank: int) -> ProcessGroup:
    """The ``index``-th group on ``axis`` (of ``members``), seen from job rank ``rank``."""
    return ProcessGroup(AXIS_KEY_BASE[axis] + index, members, members.index(rank))


def pair_group(rank: int, peer: int) -> ProcessGroup:
    """The group of job ranks ``rank`` and ``peer`` (one key for both directions)."""
    low, high = sorted((rank, peer))
    return ProcessGroup(PAIR_KEY_BASE + low * MAX_RANKS + high, (low, high),
                        0 if rank == low else 1)


def world_group(processes: int, rank: int) -> ProcessGroup:
    """Every process of the job."""
    return ProcessGroup(WORLD_KEY, tuple(range(processes)), rank)


class Coordinates(NamedTuple):
    """A process's place on each axis of a `Mesh`."""

    data: int
    pipe: int
    tensor: int


@dataclasses.dataclass(frozen=True)
class Mesh:
    """``data x pipe x tensor`` processes; rank order ``rank = (d * pipe + p) * tensor + t``.

    Attributes:
        data: D, data-parallel replicas (gradients averaged over them).
        pipe: K, pipeline stages.
        tensor: T, tensor-parallel shards of each stage's split layers.

    Example:
        >>> Mesh(tensor=4).group("tensor", rank=2).members
        (0, 1, 2, 3)
    """

    data: int = 1
    pipe: int = 1
    tensor: int = 1

    def __post_init__(self) -> None:
        for axis in AXES:
            size = getattr(self, axis)
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise StrategyConfigError(format_error(
                    f"The mesh's {axis} axis must be a positive int.",
                    received=f"{axis}={size!r}", expected="an int >= 1",
                    fix=f"pass {axis}=1 for no {axis} parallelism"))
        if self.size > MAX_RANKS:
            raise StrategyConfigError(format_error(
                "The mesh has more processes than tfdist's collective keys allow.",
                received=f"{self.data} x {self.pipe} x {self.tensor} = {self.size}",
                expected=f"at most {MAX_RANKS} processes", fix="use fewer processes"))

    @classmethod
    def for_processes(cls, processes: int, pipe: int = 1, tensor: int = 1) -> Mesh:
        """The mesh of ``processes`` processes with ``pipe`` stages split ``tensor`` ways;
        raises, naming the counts and the fix, unless ``pipe * tensor`` divides ``processes``.

        Example:
            >>> Mesh.for_processes(6, tensor=3)
            Mesh(data=2, pipe=1, tensor=3)
        """
        model = pipe * tensor
        if processes < 1 or processes % model:
            low = max(model, processes - processes % model)
            raise StrategyConfigError(format_error(
                f"{processes} process(es) cannot hold whole model replicas of {pipe} stage(s) "
                f"x {tensor} tensor shard(s) = {model} processes each.",
                received=f"processes={processes}, stages={pipe}, tensor={tensor}",
                expected=f"a multiple of {model} (D replicas x {pipe} x {tensor})",
                fix=f"use --workers {low} (or {low + model}), or --stages/--tensor whose "
                f"product divides {processes}"))
        return cls(data=processes // model, pipe=pipe, tensor=tensor)

    @classmethod
    def parse(cls, text: str) -> Mesh:
        """The mesh ``"data=2,pipe=1,tensor=2"`` names (`to_env`'s form; an axis left out is 1).

        Example:
            >>> Mesh.parse("tensor=4")
            Mesh(data=1, pipe=1, tensor=4)
        """
        sizes: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            axis, _, value = part.partition("=")
            if axis.strip() not in AXES or not value.strip().isdigit() or axis.strip() in sizes:
                raise StrategyConfigError(format_error(
                    f"{MESH_ENV} does not name a mesh.", received=f"{MESH_ENV}={text!r}",
                    expected="'data=D,pipe=K,tensor=T', each axis once, sizes >= 1",
                    fix=f"unset {MESH_ENV} (tfdist-launch sets it), or write e.g. "
                    "'data=2,pipe=1,tensor=2'"))
            sizes[axis.strip()] = int(value)
        return cls(**sizes)

    def to_env(self) -> str:
        """The mesh as `MESH_ENV` carries it, e.g. ``"data=2,pipe=1,tensor=2"``."""
        return ",".join(f"{axis}={getattr(self, axis)}" for axis in AXES)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> tuple[Mesh, int]:
        """This process's mesh and rank: the shape from `MESH_ENV` (unset: every training task
        of TF_CONFIG on the data axis), the rank from TF_CONFIG (`TRAINING_ROLES` order).

        Without TF_CONFIG the job is this one process: rank 0 of a mesh of one.

        Raises:
            StrategyConfigError: `MESH_ENV` is malformed, its size is not TF_CONFIG's number of
                training tasks, or this task is not one of them (a ``ps`` or the evaluator).

        Example:
            >>> env = {"TFDIST_MESH": "data=1,pipe=1,tensor=2", "TF_CONFIG": '{"cluster": '
            ...        '{"worker": ["h:1", "h:2"]}, "task": {"type": "worker", "index": 1}}'}
            >>> Mesh.from_environment(env)
            (Mesh(data=1, pipe=1, tensor=2), 1)
        """
        environ = os.environ if environ is None else environ
        view = peek_tf_config(environ)
        processes, rank = 1, 0
        if view is not None:
            processes = sum(view.count(role) for role in TRAINING_ROLES)
            rank = task_rank(view.task_type, view.task_index, view.count("chief"))
        text = environ.get(MESH_ENV, "").strip()
        mesh = cls.parse(text) if text else cls(data=processes)
        if mesh.size != processes:
            raise StrategyConfigError(format_error(
                f"{MESH_ENV} and TF_CONFIG disagree on the number of processes.",
                received=f"{MESH_ENV}={text!r} ({mesh.size} processes), TF_CONFIG with "
                f"{processes} chief/worker task(s)",
                expected="data x pipe x tensor = the number of chief and worker tasks",
                fix="start the job with tfdist-launch (it writes both), or fix one of them"))
        return mesh, rank

    @property
    def size(self) -> int:
        """N, the number of processes."""
        return self.data * self.pipe * self.tensor

    def coordinates(self, rank: int) -> Coordinates:
        """Where ``rank`` sits on each axis."""
        self._check_rank(rank)
        rest, tensor = divmod(rank, self.tensor)
        data, pipe = divmod(rest, self.pipe)
        return Coordinates(data, pipe, tensor)

    def rank_of(self, data: int = 0, pipe: int = 0, tensor: int = 0) -> int:
        """The rank at these coordinates."""
        return (data * self.pipe + pipe) * self.tensor + tensor

    def members(self, axis: Axis, rank: int) -> tuple[int, ...]:
        """The ranks that differ from ``rank`` only along ``axis``, in the axis's order."""
        place = self.coordinates(rank)._asdict()
        ranks = []
        for i in range(self._size_of(axis)):
            place[axis] = i
            ranks.append(self.rank_of(**place))
        return tuple(ranks)

    def group(self, axis: Axis, rank: int) -> ProcessGroup:
        """``rank``'s group on ``axis`` (its members, key, and ``rank``'s place in it)."""
        self._size_of(axis)
        data, pipe, tensor = self.coordinates(rank)
        index = {DATA: pipe * self.tensor + tensor, PIPE: data * self.tensor + tensor,
                 TENSOR: data * self.pipe + pipe}[axis]
        return axis_group(axis, index, self.members(axis, rank), rank)

    def pair(self, rank: int, peer: int) -> ProcessGroup:
        """The group of ``rank`` and ``peer`` (sends and receives between them)."""
        self._check_rank(peer)
        return pair_group(rank, peer)

    def world(self, rank: int) -> ProcessGroup:
        """Every process of the job."""
        self._check_rank(rank)
        return world_group(self.size, rank)

    def _size_of(self, axis: Axis) -> int:
        if axis not in AXES:
            raise StrategyConfigError(format_error(
                "Unknown mesh axis.", received=f"axis={axis!r}", expected=f"one of {AXES}",
                fix="ask for 'data', 'pipe' or 'tensor'"))
        return getattr(self, axis)

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.size:
            raise StrategyConfigError(format_error(
                "rank is out of the mesh.", received=f"rank={rank}",
                expected=f"0 <= rank < {self.size} ({self.data} x {self.pipe} x {self.tensor})",
                fix="pass this task's worker index"))


def task_rank(task_type: str, index: int, chiefs: int) -> int:
    """The mesh rank of task ``task_type:index`` in a job with ``chiefs`` chief tasks (0 or 1):
    the training tasks in `TRAINING_ROLES` order.

    Example:
        >>> task_rank("chief", 0, chiefs=1), task_rank("worker", 0, chiefs=1)
        (0, 1)
    """
    if task_type not in TRAINING_ROLES:
        raise StrategyConfigError(format_error(
            "This task is not on the job's mesh.", received=f"task type {task_type!r}",
            expected=f"one of {TRAINING_ROLES} (the tasks that train)",
            fix="ask for the mesh on chief and worker tasks only"))
    return index if task_type == "chief" else chiefs + index
