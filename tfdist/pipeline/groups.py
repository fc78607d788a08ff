"""The collective groups of a job, by axis: who is in each, under which key. TensorFlow-free.

A job's processes sit on named axes; each process belongs to one group per axis (the processes
that differ from it only along that axis), and has a rank on it. The pipeline has two axes:

* ``"pipe"``: the K stages of one pipeline replica (the last stage shares loss, metrics and
  predictions with them); a process's rank on it is its stage.
* ``"data"``: the D replicas of one stage (its gradients are averaged there); a process's rank
  on it is its replica.

Besides, each pair of neighbouring stages is a group of two (sends and receives), and the whole
job is one group (the exit barrier). `tfdist.pipeline.layout.PipelineLayout` answers "my group
on this axis" with a `ProcessGroup`; the transport (`tfdist.pipeline.transport`) asks it and
never makes a key itself. A mesh of processes on more axes (data x pipe x tensor) takes the
layout's place by answering the same question.

Keys (TensorFlow's collective ``group_key``, unique per group in the job):

* axis ``a``'s ``i``-th group: ``AXIS_KEY_BASE[a] + i`` (``i``: the stage for ``"data"``, the
  replica for ``"pipe"``);
* the pair of ranks ``a < b``: ``PAIR_KEY_BASE + a * MAX_RANKS + b``;
* the whole job: ``WORLD_KEY``.

Example:
    >>> group = axis_group("data", index=1, members=(1, 3), rank=3)
    >>> group.key, group.size, group.rank
    (524289, 2, 1)
    >>> pair_group(3, 2).key, pair_group(3, 2).peer
    (1056771, 2)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

from tfdist.errors import StrategyConfigError, format_error

__all__ = ["Axis", "DATA", "PIPE", "ProcessGroup", "axis_group", "pair_group", "world_group",
           "MAX_RANKS"]

Axis = Literal["data", "pipe"]
"""The pipeline's axes; a process mesh adds ``"tensor"``."""
DATA: Axis = "data"
PIPE: Axis = "pipe"

MAX_RANKS = 4096
PAIR_KEY_BASE = 1 << 20
AXIS_KEY_BASE: Mapping[str, int] = MappingProxyType({DATA: 1 << 19, PIPE: 1 << 18})
WORLD_KEY = 1 << 17


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
