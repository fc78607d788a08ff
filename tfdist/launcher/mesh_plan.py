"""The job's process mesh as the launcher plans, checks and shows it (`tfdist.parallel.Mesh`).

A strategy that lays its processes on a mesh takes ``--stages`` and/or ``--tensor`` (its
``traits.launch_options`` name them). ``--workers N --stages K --tensor T`` then gives
``D = N / (K T)`` data-parallel replicas; every task gets the mesh's shape in `MESH_ENV`
(``TFDIST_MESH="data=2,pipe=1,tensor=2"``) and reads its place back with
`tfdist.parallel.place.process_place`. ``--dry-run`` shows each task's coordinates and groups
(`describe_rank`). Tensor groups all-reduce activations at every block, so they belong on one
host: ranks are neighbours along ``tensor``, and `tensor_hosts_warning` says when a job's hosts
split one group anyway.

Example:
    >>> mesh = Mesh.for_processes(4, tensor=2)
    >>> describe_rank(mesh, 3)["coordinates"]
    {'data': 1, 'pipe': 0, 'tensor': 1}
    >>> tensor_hosts_warning(mesh, ["n1", "n1", "n2", "n2"]) is None
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tfdist.core.registry import strategies_taking
from tfdist.core.traits import StrategyTraits
from tfdist.errors import TfdistError
from tfdist.launcher.options import JobOptions
from tfdist.parallel.mesh import AXES, MESH_ENV, TENSOR, Mesh

__all__ = ["MESH_ENV", "MESH_OPTIONS", "training_processes", "plan_mesh", "mesh_problem",
           "describe_rank", "tensor_hosts_warning", "option_fix", "ray_spread_warning"]

MESH_OPTIONS = ("stages", "tensor")
"""The launcher options that shape the mesh (``--stages K``: its pipe axis, ``--tensor T``)."""


def training_processes(options: JobOptions, traits: StrategyTraits) -> int:
    """The processes on the mesh: the workers and the chief, if the job has one."""
    assert options.workers is not None, "plan_job decides the workers first"
    return options.workers + int(traits.chief(options.chief))


def plan_mesh(options: JobOptions, traits: StrategyTraits) -> Mesh | None:
    """The job's mesh, for a strategy that takes ``--stages`` or ``--tensor`` (whether given or
    not: the tasks then read T from the mesh alone, not from a variable the launcher's shell
    may still hold); None for any other strategy (its tasks see every process on the data
    axis, `Mesh.from_environment`). Without ``--tensor``, T is the strategy's
    ``traits.tensor_default``.

    Example:
        >>> from tfdist.core.traits import TENSOR
        >>> plan_mesh(JobOptions("t.py", workers=4), TENSOR)
        Mesh(data=1, pipe=1, tensor=4)
    """
    asked = options.strategy_options
    if not any(o in traits.launch_options for o in MESH_OPTIONS):
        return None
    processes, pipe = training_processes(options, traits), asked.stages or 1
    tensor = asked.tensor or (1 if traits.tensor_default == 1 else max(1, processes // pipe))
    return Mesh.for_processes(processes, pipe=pipe, tensor=tensor)


def mesh_problem(options: JobOptions, traits: StrategyTraits) -> str | None:
    """What is wrong with ``--tensor`` for this job's processes, as one line, or None.

    ``--tensor`` with a strategy that does not take it is refused by the option check before
    this (`option_fix` names the fix).

    Example:
        >>> from tfdist.core.traits import PIPELINE
        >>> mesh_problem(JobOptions("t.py", workers=2), PIPELINE) is None
        True
    """
    stages, tensor = options.strategy_options.stages, options.strategy_options.tensor
    if tensor is None:
        return None
    schedule = _multi_chunk_schedule(options)
    if tensor > 1 and schedule:
        return (f"--schedule {schedule} --tensor {tensor}: the {schedule} schedule puts several "
                "chunks of the model on each process, which tensor parallelism does not split "
                "(the tasks would refuse it after start-up). Fix: use --schedule 1f1b (or gpipe) "
                "with --tensor, or drop --tensor")
    processes = training_processes(options, traits)
    model = tensor * (stages or 1)
    chief = processes - (options.workers or 0)
    if tensor > processes:
        return (f"--tensor {tensor} is more than the job's {processes} process(es): each tensor "
                f"shard is a process of its own. Fix: use {_workers_fix(model, chief)} (or a "
                f"multiple), or --tensor {processes} or less")
    try:
        Mesh.for_processes(processes, pipe=stages or 1, tensor=tensor)
    except TfdistError as err:
        shape = f"--stages {stages} --tensor {tensor}" if stages else f"--tensor {tensor}"
        if not chief:
            return f"{shape} with {processes} process(es): {err}"
        low = max(model, processes - processes % model)
        return (f"{shape} with {processes} process(es) (--workers {options.workers} and the "
                f"chief, which is a process of the mesh too): {processes} cannot hold whole "
                f"model replicas of {model} processes each. Fix: use "
                f"{_workers_fix(low, chief)}, or --stages/--tensor whose product divides "
                f"{processes}")
    return None


def _workers_fix(processes: int, chief: int) -> str:
    """How to ask for ``processes`` processes on the mesh, with or without a chief.

    Example:
        >>> _workers_fix(4, 0), _workers_fix(2, 1)
        ('--workers 4', '--workers 1 with --chief, or --workers 2 without it')
    """
    if not chief:
        return f"--workers {processes}"
    return f"--workers {processes - chief} with --chief, or --workers {processes} without it"


def _multi_chunk_schedule(options: JobOptions) -> str | None:
    """The ``--schedule`` given when it holds several chunks per process (interleaved)."""
    name = getattr(options.strategy_options, "schedule", None)
    if not name:
        return None
    from tfdist.pipeline.schedule import SCHEDULES

    cls = SCHEDULES.get(name)
    return name if cls is not None and cls.multi_chunk else None


def option_fix(option: str) -> str:
    """The fix for a launcher ``option`` given with a strategy that does not take it: drop it,
    or use one that does (the registry's traits say which).

    Example:
        >>> option_fix("stages")
        'drop --stages, or use --strategy pipeline'
    """
    flag = "--" + option.replace("_", "-")
    names = strategies_taking(option)
    if not names:
        return f"drop {flag} (no registered strategy takes it yet)"
    return f"drop {flag}, or use " + " or ".join(f"--strategy {name}" for name in names)


def describe_rank(mesh: Mesh, rank: int) -> dict[str, Any]:
    """What ``--dry-run`` shows of a task on the mesh: its rank, coordinates, and the members
    and collective key of its group on each axis."""
    groups = {}
    for axis in AXES:
        group = mesh.group(axis, rank)
        groups[axis] = {"members": list(group.members), "key": group.key}
    return {"shape": mesh.to_env(), "rank": rank,
            "coordinates": dict(mesh.coordinates(rank)._asdict()), "groups": groups}


def tensor_hosts_warning(mesh: Mesh, hosts: Sequence[str]) -> str | None:
    """A warning when a tensor group's processes are on more than one host (``hosts[rank]``:
    where rank runs), else None.

    Example:
        >>> print(tensor_hosts_warning(Mesh(tensor=2), ["n1", "n2"]))
        ... # doctest: +ELLIPSIS
        tensor group of ranks 0-1 spans hosts n1, n2: ...
    """
    split = []
    for rank in range(0, mesh.size, mesh.tensor):
        members = mesh.group(TENSOR, rank).members
        on = sorted({hosts[m] for m in members})
        if len(on) > 1:
            split.append(f"tensor group of ranks {members[0]}-{members[-1]} spans hosts "
                         f"{', '.join(on)}")
    if not split:
        return None
    return (f"{'; '.join(split)}: its all-reduces of activations (two per block forward, two "
            "back) will cross the network, and training will be slow. Fix: give each host a "
            f"multiple of {mesh.tensor} slots (tensor groups are {mesh.tensor} neighbouring "
            "ranks, placed host by host)")


def ray_spread_warning(mesh: Mesh | None, placement: str) -> str | None:
    """A warning when Ray may spread a tensor group over nodes (``--ray-placement SPREAD``).

    Example:
        >>> ray_spread_warning(Mesh(tensor=2), "PACK") is None
        True
    """
    if mesh is None or mesh.tensor == 1 or placement != "SPREAD":
        return None
    return (f"--ray-placement SPREAD may put the {mesh.tensor} processes of a tensor group on "
            "different nodes: their all-reduces of activations at every block would cross the "
            "network, and training will be slow. Fix: --ray-placement PACK (tensor groups are "
            "neighbouring tasks, packed node by node)")
