"""This process's place on the job's mesh, read once per process: my group on an axis, my rank.

Megatron's ``parallel_state`` shape: the job's mesh and this process's rank are found once
(`process_place`), and the pipeline and the tensor layers ask the answer (`MeshPlace`) for
"my group on this axis" and "my rank on it" instead of each deriving them.

Where the shape comes from, first found first:

1. the caller's arguments (a strategy's ``shards=T``, ``tensor=T``): they override;
2. ``TFDIST_MESH`` (`tfdist.parallel.mesh.MESH_ENV`), which ``tfdist-launch`` writes on every
   task of a strategy laid on a mesh: the one encoding of T across the process boundary, so a
   stale variable in the launcher's shell does not change a launched job;
3. only without ``TFDIST_MESH`` (a hand-set environment): ``TFDIST_TENSOR_SHARDS``, which the
   strategies' docs promise for ``get_strategy("tensor")``;
4. the caller's default (1; or ``"all"``: every process, the tensor strategy's).

The rank is this task's place among TF_CONFIG's chief and workers; without TF_CONFIG the job is
this one process. TensorFlow-free.

Example:
    >>> env = {"TFDIST_MESH": "data=2,pipe=1,tensor=2", "TF_CONFIG": '{"cluster": {"worker": '
    ...        '["h:1", "h:2", "h:3", "h:4"]}, "task": {"type": "worker", "index": 3}}'}
    >>> place = process_place(environ=env)
    >>> place.rank, place.rank_on("tensor"), place.group("data").members
    (3, 1, (1, 3))
    >>> process_place(tensor=4, environ=env).mesh      # an argument overrides the environment
    Mesh(data=1, pipe=1, tensor=4)
    >>> process_place(tensor="all", environ={}).mesh   # one process, no TF_CONFIG
    Mesh(data=1, pipe=1, tensor=1)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping
from typing import Any, Literal

from tfdist.core.environ import TF_CONFIG
from tfdist.core.traits import TENSOR_SHARDS_ENV
from tfdist.errors import StrategyConfigError, format_error
from tfdist.parallel.mesh import MESH_ENV, Axis, Coordinates, Mesh, ProcessGroup

__all__ = ["MeshPlace", "Shards", "process_place", "place_of", "tensor_shards", "TENSOR_SHARDS_ENV"]

Shards = int | Literal["all"]
"""A tensor size: a count, or ``"all"``: every process of a pipeline (``processes / pipe``)."""


@dataclasses.dataclass(frozen=True)
class MeshPlace:
    """Process ``rank`` on ``mesh``: its groups, and its rank and size on each axis.

    Attributes:
        mesh: The job's processes on ``data x pipe x tensor``.
        rank: This process's rank in the job.

    Example:
        >>> place = place_of(processes=8, rank=5, pipe=2, tensor=2)
        >>> place.coordinates, place.rank_on("pipe"), place.size_of("data")
        (Coordinates(data=1, pipe=0, tensor=1), 0, 2)
        >>> place.group("tensor").members, place.pair(7).key, place.world().size
        ((4, 5), 1069063, 8)
    """

    mesh: Mesh
    rank: int

    def __post_init__(self) -> None:
        self.mesh.coordinates(self.rank)  # raises, naming the fix, when rank is off the mesh

    @property
    def coordinates(self) -> Coordinates:
        """Where this process sits on each axis."""
        return self.mesh.coordinates(self.rank)

    def rank_on(self, axis: Axis) -> int:
        """This process's rank on ``axis`` (its place in its group there)."""
        return self.group(axis).rank

    def size_of(self, axis: Axis) -> int:
        """The processes on ``axis`` (D, K or T)."""
        return self.group(axis).size

    def group(self, axis: Axis) -> ProcessGroup:
        """This process's group on ``axis``: ``"data"`` (its replicas), ``"pipe"`` (the stages
        of its replica), ``"tensor"`` (the shards of its layers)."""
        return self.mesh.group(axis, self.rank)

    def pair(self, peer: int) -> ProcessGroup:
        """The group of this process and ``peer`` (sends and receives between them)."""
        return self.mesh.pair(self.rank, peer)

    def world(self) -> ProcessGroup:
        """Every process of the job."""
        return self.mesh.world(self.rank)

    @property
    def is_chief(self) -> bool:
        """Whether this is rank 0 (the chief, or ``worker:0`` in a job without one)."""
        return self.rank == 0


def place_of(processes: int, rank: int, pipe: int = 1, tensor: Shards = 1) -> MeshPlace:
    """Rank ``rank`` of ``processes`` processes laid out as ``pipe`` stages of ``tensor``
    shards: the one builder of a mesh from counts outside the launcher; raises, naming the fix,
    unless ``pipe x tensor`` divides ``processes``.

    Example:
        >>> place_of(6, rank=4, tensor=3).coordinates
        Coordinates(data=1, pipe=0, tensor=1)
    """
    if tensor == "all":
        tensor = max(1, processes // pipe)
    return MeshPlace(Mesh.for_processes(processes, pipe=pipe, tensor=tensor), rank)


def process_place(tf_config: str | Mapping[str, Any] | None = None, *, pipe: int | None = None,
                  tensor: Shards | None = None, default_tensor: Shards = 1,
                  environ: Mapping[str, str] | None = None) -> MeshPlace:
    """This process's place, the environment read once (see the module's order).

    Args:
        tf_config: The TF_CONFIG to use instead of the environment's.
        pipe: K, processes per pipeline (None: the environment's mesh, else 1).
        tensor: T (None: the environment's mesh, else ``TFDIST_TENSOR_SHARDS``, else
            ``default_tensor``).
        default_tensor: T when nothing says it.
        environ: The environment (default ``os.environ``).

    Raises:
        StrategyConfigError: a malformed ``TFDIST_MESH`` or ``TFDIST_TENSOR_SHARDS``, a mesh
            whose size is not TF_CONFIG's chief and workers, or sizes that do not divide them.
    """
    environ = os.environ if environ is None else environ
    if tf_config is not None:
        text = tf_config if isinstance(tf_config, str) else json.dumps(dict(tf_config))
    else:
        text = environ.get(TF_CONFIG, "")
    mesh, rank, processes = _read(environ.get(MESH_ENV, ""), text)
    if mesh is not None and pipe is None and tensor is None:
        return MeshPlace(mesh, rank)
    if tensor is None:
        if mesh is not None:
            tensor = mesh.tensor
        elif TENSOR_SHARDS_ENV in environ:
            tensor = tensor_shards(None, 1, environ)
        else:
            tensor = default_tensor
    elif tensor != "all":
        tensor = tensor_shards(tensor, 1, environ)
    if pipe is None:
        pipe = 1 if mesh is None else mesh.pipe
    return place_of(processes, rank, pipe=pipe, tensor=tensor)


@functools.lru_cache(maxsize=8)
def _read(mesh_text: str, tf_config_text: str) -> tuple[Mesh | None, int, int]:
    """``TFDIST_MESH``'s mesh (None when unset), this task's rank and the job's processes,
    parsed once per process (per pair of values)."""
    whole, rank = Mesh.from_environment({MESH_ENV: mesh_text, TF_CONFIG: tf_config_text})
    return (whole if mesh_text.strip() else None), rank, whole.size


def tensor_shards(shards: int | None, default: int,
                  environ: Mapping[str, str] | None = None) -> int:
    """T: ``shards`` if given, else ``$TFDIST_TENSOR_SHARDS``, else ``default``.

    Raises:
        StrategyConfigError: a value that is not a positive int.

    Example:
        >>> tensor_shards(None, 1, {}), tensor_shards(None, 1, {"TFDIST_TENSOR_SHARDS": "2"})
        (1, 2)
    """
    environ = os.environ if environ is None else environ
    value: Any = shards if shards is not None else environ.get(TENSOR_SHARDS_ENV, str(default))
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if isinstance(value, bool) or number < 1 or str(number) != str(value).strip():
        raise StrategyConfigError(format_error(
            "The tensor shard count must be a positive int.",
            received=f"shards={value!r}", expected="an int >= 1 that divides the processes",
            fix=f"pass shards=T (pipeline: tensor=T) or set {TENSOR_SHARDS_ENV}=T"))
    return number
