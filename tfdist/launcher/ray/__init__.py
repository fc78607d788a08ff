"""``--ray [ADDRESS]``: a job as a gang of Ray actors.

* `gang`: `RayGang` and `run_on_ray`, the job's actors in one placement group.
* `actor`: the actor that runs one task on its Ray node.
* `options`: `RayOptions`.

`RUNNER` is its record in `tfdist.launcher.runners`: the ``ray`` argument group, its checks, its
dry run (one JSON object per task) and `run_on_ray`. Ray itself is imported only to run.

Example:
    >>> from tfdist.launcher.arguments import build_parser
    >>> args = build_parser().parse_args(["--ray", "10.0.0.1:6379", "--env", "HOME", "t.py"])
    >>> ray_options(args).env_names, ray_problem(args)
    (('HOME',), None)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from tfdist.errors import LaunchError, MissingDependencyError
from tfdist.launcher.ray.options import RayOptions
from tfdist.launcher.runners import Runner, environment_default

if TYPE_CHECKING:
    from tfdist.launcher.plan import JobPlan

__all__ = ["RUNNER", "add_ray_arguments", "ray_options", "ray_problem"]


def add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``ray`` argument group (``--ray [ADDRESS]`` and the gang's settings)."""
    group = parser.add_argument_group("ray (run the job on a Ray cluster)")
    group.add_argument(
        "--ray", nargs="?", const="auto", default=environment_default("RAY"),
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
                       help="seconds to wait for the cluster to answer, the gang's resources and "
                       "its actors (default 60)")


def ray_options(args: argparse.Namespace) -> RayOptions | None:
    """``--ray`` and its settings (None: no ``--ray``; raises ValueError for a bad value); the
    variables given to remote tasks are ``--env``'s, of the ``hosts`` group."""
    if args.ray is None:
        return None
    return RayOptions(address=args.ray, cpus_per_task=args.ray_cpus_per_task,
                      placement=args.ray_placement, gang_timeout=args.ray_gang_timeout,
                      env_names=tuple(args.env_names))


def ray_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the ``--ray`` options, or None."""
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
        ray_options(args)
    except ValueError as err:
        return str(err)
    return None


def _warn_spread(plan: JobPlan, options: RayOptions) -> None:
    from tfdist.launcher.mesh_plan import ray_spread_warning

    warning = ray_spread_warning(plan.mesh, options.placement)
    if warning:
        print(f"tfdist-launch: warning: {warning}", file=sys.stderr)


def describe_gang(plan: JobPlan, options: RayOptions) -> list[str]:
    """``--ray --dry-run``: one JSON object per task (addresses are chosen at start)."""
    from tfdist.launcher.ray.gang import describe

    _warn_spread(plan, options)
    return [json.dumps(line) for line in describe(plan, options)]


def run_gang(plan: JobPlan, options: RayOptions) -> int:
    """Runs the job on Ray (`run_on_ray`); a cluster that cannot run it exits 1."""
    from tfdist.launcher.ray.gang import run_on_ray

    _warn_spread(plan, options)
    try:
        return run_on_ray(plan, options)
    except (LaunchError, MissingDependencyError) as err:
        print(f"tfdist-launch: error: {err}", file=sys.stderr)
        return 1


RUNNER = Runner(
    "ray", describe=describe_gang, run=run_gang, chosen=lambda args: args.ray is not None,
    add_arguments=add_ray_arguments, environment=("RAY",), options=ray_options,
    problem=ray_problem, task_group="tfdist.launcher.ray.gang:RayGang")
