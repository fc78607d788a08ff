"""``tfdist-launch``: start a whole training job on this machine, or show what would start.

Examples::

    tfdist-launch --workers 2 train.py --epochs 3          # multi-worker, 2 processes
    tfdist-launch --ps 1 --workers 2 --evaluator train.py  # parameter server + sidecar evaluator
    tfdist-launch --strategy horovod --workers 2 train.py  # through horovodrun --gloo
    tfdist-launch --strategy horovod --workers 2 --min-workers 1 --max-workers 2 train.py  # elastic
    tfdist-launch --dry-run --workers 2 train.py           # print each task's TF_CONFIG and command
    tfdist-launch --strategy tensor --workers 4 --tensor 2 train.py  # 2 replicas x 2 shards
    tfdist-launch --check                                  # what is installed
    tfdist-launch --hosts n1:2,n2:2 --workers 4 train.py   # tasks on n1, n2 (over ssh)
    tfdist-launch --export kubeflow --image me/train:1 --ps 1 train.py  # a Kubeflow TFJob
    tfdist-launch --export slurm --nodes 2 --output job.sbatch train.py  # a Slurm batch script
    tfdist-launch --ray 10.0.0.1:6379 --workers 4 train.py  # one Ray actor per task, as a gang
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from collections.abc import Sequence

from tfdist.cluster.address import MAX_PORT
from tfdist.core.environ import peek_tf_config
from tfdist.errors import (
    ClusterConfigError,
    LaunchError,
    MissingDependencyError,
    StrategyConfigError,
    TfdistError,
)
from tfdist.launcher import arguments
from tfdist.launcher.arguments import EXPORT_ONLY, job_options, ray_options
from tfdist.launcher.export import run_export
from tfdist.launcher.mesh_plan import ray_spread_warning
from tfdist.launcher.options import JobOptions
from tfdist.launcher.placement import place
from tfdist.launcher.plan import JobPlan, LayoutError, plan_job

__all__ = ["Launch", "build_parser", "parse_args", "main"]


@dataclasses.dataclass(frozen=True)
class Launch:
    """What ``tfdist-launch`` was asked to do.

    Attributes:
        plan: The job, decided (None with ``--check``); its ``options`` are the parsed ones.
        dry_run: Print what would run (or the export) instead.
        check: Report what is installed, and nothing else.
    """

    plan: JobPlan | None
    dry_run: bool = False
    check: bool = False


def build_parser() -> argparse.ArgumentParser:
    """The ``tfdist-launch`` parser (`tfdist.launcher.arguments`), with this module's examples."""
    return arguments.build_parser(epilog=__doc__.split("Examples::", 1)[1])


def parse_args(argv: Sequence[str] | None = None) -> Launch:
    """Parses ``argv`` into typed options and plans the job (`plan_job`, once); exits with status
    2 and a one-line message when invalid.

    Problems are named in this order: the ``TFDIST_LAUNCH_*`` variables
    (`arguments.environment_problem`), ``--export`` and ``--ray`` arguments, an unknown strategy,
    the job's own arguments, the tasks' layout for the strategy, the ``--hosts`` arguments.
    """
    parser = build_parser()
    problem = arguments.environment_problem(parser) or _tf_config_problem()
    if problem:
        parser.error(problem)
    args = parser.parse_args(argv)
    if args.check:
        return Launch(None, dry_run=args.dry_run, check=True)
    problem = _export_problem(args) or _ray_problem(args)
    if problem:
        parser.error(problem)
    plan = _plan(parser, job_options(args))
    layout = plan if isinstance(plan, str) else None
    problem = _argument_problem(args) or layout or _host_problem(args)
    if problem:
        parser.error(problem)
    assert isinstance(plan, JobPlan)
    return Launch(plan, dry_run=args.dry_run)


def _plan(parser: argparse.ArgumentParser, options: JobOptions) -> JobPlan | str:
    """The plan, or the layout problem that stopped it (named after the job's own arguments);
    an unknown strategy exits at once."""
    try:
        return plan_job(options)
    except LayoutError as err:
        return str(err)
    except TfdistError as err:
        parser.error(str(err))


def _tf_config_problem() -> str | None:
    """What is wrong with a TF_CONFIG in the launcher's environment, or None.

    The launcher writes each task's TF_CONFIG itself and passes none of its own on; a malformed
    one is still refused, since whoever set it expected it to mean something.
    """
    try:
        peek_tf_config()
    except ClusterConfigError as err:
        return (f"In tfdist-launch's own environment: {err.args[0].split(' Fix:')[0]} Fix: "
                "unset TF_CONFIG (tfdist-launch writes each task's own)")
    return None


def _export_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the ``--export`` arguments, or None."""
    given = [name for name in EXPORT_ONLY if getattr(args, name) is not None]
    if given and not args.export:
        flag = "--" + given[0].replace("_", "-")
        return (f"{flag} only applies with --export. Fix: add --export kubeflow|mpijob|slurm, "
                f"or drop {flag}")
    if args.image is not None and not args.image.strip():
        return "--image is empty. Fix: name a container image that holds tfdist and the script"
    if args.output is not None and os.path.isdir(args.output):
        suffix = "sbatch" if args.export == "slurm" else "yaml"
        return (f"--output {args.output!r} is a directory. Fix: name a file, e.g. "
                f"{os.path.join(args.output, 'job.' + suffix)}")
    return None


def _ray_problem(args: argparse.Namespace) -> str | None:
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


def _argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the job's own arguments (no strategy needed), or None."""
    if not args.script:
        return "missing SCRIPT: the training script to run (e.g. tfdist-launch train.py)"
    if not args.export and not os.path.isfile(args.script):  # exports name the script remotely
        return f"script not found: {args.script!r}. Fix: pass the path of an existing file"
    if args.evaluator_grace < 0:
        return f"--evaluator-grace must be 0 or more seconds. Received: {args.evaluator_grace}"
    if not math.isfinite(args.preemption_grace) or args.preemption_grace < 0:
        return (f"--preemption-grace must be 0 or more seconds. Received: "
                f"{args.preemption_grace}. Fix: e.g. --preemption-grace 25")
    if args.max_restarts < 0:
        return f"--max-restarts must be 0 or more. Received: {args.max_restarts}"
    if args.max_worker_restarts < 0:
        return f"--max-worker-restarts must be 0 or more. Received: {args.max_worker_restarts}"
    if args.timeout is not None and (not math.isfinite(args.timeout) or args.timeout <= 0):
        return (f"--timeout must be a positive number of seconds. Received: {args.timeout}. "
                "Fix: e.g. --timeout 3600")
    if args.startup_timeout is not None and not (
            math.isfinite(args.startup_timeout) and args.startup_timeout > 0):
        return (f"--startup-timeout must be a positive number of seconds. Received: "
                f"{args.startup_timeout}. Fix: e.g. --startup-timeout 120")
    elastic = (args.min_workers, args.max_workers) != (None, None)
    if elastic and (args.ray is not None or args.export):
        return ("--min-workers/--max-workers run horovodrun's elastic mode on this machine; "
                f"{'--export' if args.export else '--ray'} cannot carry them. Fix: drop them, or "
                "drop --ray/--export")
    if args.log_dir is not None and not args.dry_run and not args.export:
        problem = _unwritable_dir(args.log_dir)
        if problem:
            return (f"--log-dir {args.log_dir!r} cannot be used: {problem}. Fix: pass a directory "
                    "you can create and write, or drop --log-dir")
    return None


def _unwritable_dir(path: str) -> str | None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        return err.strerror or str(err)
    if not os.access(path, os.W_OK | os.X_OK):
        return "it is not writable"
    return None


def _host_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the ``--hosts`` and ssh arguments, or None."""
    for flag, value in (("--hosts", args.hosts), ("--hostfile", args.hostfile)):
        if value is not None and not value.strip():
            return (f"{flag} is empty (an unset shell variable?). Received: {flag} {value!r}. "
                    f"Fix: name the hosts, e.g. --hosts node1:2,node2:2, or drop {flag}")
    if args.hosts and args.hostfile:
        return (f"--hosts and --hostfile were both given. Received: --hosts {args.hosts!r}, "
                f"--hostfile {args.hostfile!r}. Fix: pass one of them")
    on_hosts = bool(args.hosts or args.hostfile)
    for flag, value in (("--base-port", args.base_port), ("--ssh-port", args.ssh_port),
                        ("--ssh-identity", args.ssh_identity),
                        ("--ssh-known-hosts", args.ssh_known_hosts),
                        ("--no-host-key-check", args.no_host_key_check or None),
                        ("--env", None if args.ray else args.env_names or None),
                        ("--network-interface", args.network_interface)):
        if value is not None and not on_hosts:
            return f"{flag} only applies with --hosts or --hostfile. Fix: add one, or drop {flag}"
    if args.ssh_port is not None and not 1 <= int(args.ssh_port) <= MAX_PORT:
        return f"--ssh-port must be in 1..{MAX_PORT}. Received: {args.ssh_port}"
    missing = [name for name in args.env_names if name not in os.environ]
    if missing:
        return (f"--env {missing[0]}: no such variable in the launcher's environment. Fix: export "
                f"it first, or drop --env {missing[0]}")
    if args.ssh_known_hosts is not None and not os.path.isfile(args.ssh_known_hosts):
        return (f"--ssh-known-hosts file not found. Received: {args.ssh_known_hosts!r}. "
                "Fix: pass an existing known_hosts file (ssh-keyscan -p PORT HOST >> FILE)")
    if args.ssh_identity is not None and not os.path.isfile(args.ssh_identity):
        return (f"--ssh-identity file not found. Received: {args.ssh_identity!r}. "
                "Fix: pass the path of an existing private key")
    return None


def main(argv: Sequence[str] | None = None) -> int:
    launch = parse_args(argv)
    if launch.check or launch.plan is None:
        from tfdist.launcher.check import format_report, installed_report

        print(format_report(installed_report()))
        return 0
    plan = launch.plan
    try:
        if plan.options.export is not None:
            return run_export(plan, dry_run=launch.dry_run)
        if plan.options.ray is not None:
            return _run_on_ray(plan, launch.dry_run)
        placement = place(plan)
    except (ClusterConfigError, StrategyConfigError, MissingDependencyError) as err:
        print(f"tfdist-launch: error: {err}", file=sys.stderr)
        return 2
    for warning in placement.warnings:
        print(f"tfdist-launch: warning: {warning}", file=sys.stderr)
    if launch.dry_run:
        placement.release()
        for line in placement.describe():
            print(json.dumps(line))
        return 0
    from tfdist.launcher.local import run_job

    try:
        return run_job(plan, placement)
    except LaunchError as err:
        print(f"tfdist-launch: error: {err}", file=sys.stderr)
        return 1


def _run_on_ray(plan: JobPlan, dry_run: bool) -> int:
    from tfdist.launcher.ray_runner import describe, run_on_ray

    assert plan.options.ray is not None
    warning = ray_spread_warning(plan.mesh, plan.options.ray.placement)
    if warning:
        print(f"tfdist-launch: warning: {warning}", file=sys.stderr)
    if dry_run:
        for line in describe(plan, plan.options.ray):
            print(json.dumps(line))
        return 0
    try:
        return run_on_ray(plan, plan.options.ray)
    except (LaunchError, MissingDependencyError) as err:
        print(f"tfdist-launch: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
