"""The options of a job run on Ray (`tfdist.launcher.ray_runner`) and their ``--ray`` flags.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_ray_arguments(parser)
    >>> ray_options_from_args(parser.parse_args(["--ray", "--ray-placement", "PACK"]))
    RayOptions(address='auto', cpus_per_task=1.0, placement='PACK', gang_timeout=60.0, env_names=())
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Literal

__all__ = ["RayOptions", "add_ray_arguments", "check_ray_arguments", "ray_options_from_args"]

Placement = Literal["SPREAD", "PACK"]


@dataclasses.dataclass(frozen=True)
class RayOptions:
    """Where and how a job runs on Ray.

    Attributes:
        address: The cluster: ``"HOST:PORT"`` of its head, ``"auto"`` (``RAY_ADDRESS``, else the
            cluster ``ray start`` began on this machine), or ``"local"`` (a new one-node cluster
            for this job alone).
        cpus_per_task: CPUs each task's bundle holds (fractions allowed).
        placement: ``"SPREAD"`` (default) or ``"PACK"``; see the module docstring.
        gang_timeout: Seconds to wait for the gang's resources and for every actor to start.
        env_names: Variables of this environment the tasks get too (``--env NAME``).

    Example:
        >>> RayOptions(address="10.0.0.1:6379", cpus_per_task=2).placement
        'SPREAD'
    """

    address: str = "auto"
    cpus_per_task: float = 1.0
    placement: Placement = "SPREAD"
    gang_timeout: float = 60.0
    env_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.cpus_per_task > 0:
            raise ValueError(f"--ray-cpus-per-task must be more than 0. Received: "
                             f"{self.cpus_per_task}. Fix: e.g. --ray-cpus-per-task 1")
        if self.placement not in ("SPREAD", "PACK"):
            raise ValueError(f"placement must be SPREAD or PACK. Received: {self.placement!r}")
        if not self.gang_timeout > 0:
            raise ValueError(f"--ray-gang-timeout must be more than 0 seconds. Received: "
                             f"{self.gang_timeout}. Fix: e.g. --ray-gang-timeout 60")



def add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``ray`` argument group of ``tfdist-launch``."""
    group = parser.add_argument_group("ray (run the job on a Ray cluster)")
    group.add_argument(
        "--ray", nargs="?", const="auto", default=os.environ.get("TFDIST_LAUNCH_RAY"),
        metavar="ADDRESS",
        help="run every task as a Ray actor of one placement group (all start or none): "
        "ADDRESS is HOST:PORT of the head, 'auto' (the default when --ray has no value: "
        "RAY_ADDRESS, else the cluster `ray start` began here) or 'local' (env TFDIST_LAUNCH_RAY)")
    group.add_argument("--ray-cpus-per-task", type=float, default=1.0, metavar="CPUS",
                       help="CPUs each task's bundle holds (default 1)")
    group.add_argument("--ray-placement", choices=("SPREAD", "PACK"), default="SPREAD",
                       help="SPREAD (default): tasks over as many nodes as have room; PACK: "
                       "fill a node first")
    group.add_argument("--ray-gang-timeout", type=float, default=60.0, metavar="SECONDS",
                       help="seconds to wait for the gang's resources and actors (default 60)")


def check_ray_arguments(args: argparse.Namespace) -> str | None:
    """What is wrong with the ``--ray`` options, as a one-line message, or None."""
    if args.ray is None:
        return None
    if args.script is None and (args.ray.endswith(".py") or os.path.isfile(args.ray)):
        return (f"--ray took {args.ray!r} as the cluster's ADDRESS, and no SCRIPT is left. Fix: "
                f"name the address before the script (--ray auto {args.ray})")
    if args.hosts or args.hostfile or args.export:
        flag = "--export" if args.export else "--hosts/--hostfile"
        return (f"--ray was given with {flag}: Ray places the tasks itself. Fix: drop one of "
                "them")
    try:
        ray_options_from_args(args)
    except ValueError as err:
        return str(err)
    return None


def ray_options_from_args(args: argparse.Namespace) -> RayOptions:
    return RayOptions(address=args.ray, cpus_per_task=args.ray_cpus_per_task,
                      placement=args.ray_placement, gang_timeout=args.ray_gang_timeout,
                      env_names=tuple(getattr(args, "env_names", ())))
