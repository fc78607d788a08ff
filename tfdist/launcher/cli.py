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
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

from tfdist.core.environ import peek_tf_config
from tfdist.errors import (
    ClusterConfigError,
    LaunchError,
    MissingDependencyError,
    StrategyConfigError,
    TfdistError,
)
from tfdist.launcher import arguments
from tfdist.launcher.arguments import job_options
from tfdist.launcher.options import JobOptions
from tfdist.launcher.plan import JobPlan, LayoutError, plan_job
from tfdist.launcher.runners import Runner, chosen_runner, runner_problem

__all__ = ["Launch", "build_parser", "parse_args", "main"]


@dataclasses.dataclass(frozen=True)
class Launch:
    """What ``tfdist-launch`` was asked to do.

    Attributes:
        plan: The job, decided (None with ``--check``); its ``options`` are the parsed ones.
        dry_run: Print what would run (or the export) instead.
        check: Report what is installed, and nothing else.
        runner: The registered runner the command line asks for (`runners.chosen_runner`; None
            with ``--check``).
        runner_options: Its typed options (`Runner.options`).
    """

    plan: JobPlan | None
    dry_run: bool = False
    check: bool = False
    runner: Runner | None = None
    runner_options: Any = None


def build_parser() -> argparse.ArgumentParser:
    """The ``tfdist-launch`` parser (`tfdist.launcher.arguments`), with this module's examples."""
    return arguments.build_parser(epilog=__doc__.split("Examples::", 1)[1])


def parse_args(argv: Sequence[str] | None = None) -> Launch:
    """Parses ``argv`` into typed options and plans the job (`plan_job`, once); exits with status
    2 and a one-line message when invalid.

    Problems are named in this order: the ``TFDIST_LAUNCH_*`` variables
    (`arguments.environment_problem`), the runners' arguments checked before the plan
    (``--export``, ``--ray``), an unknown strategy, the job's own arguments, the tasks' layout for
    the strategy, the runners' arguments checked after it (``--hosts``), two runners at once.
    """
    parser = build_parser()
    problem = arguments.environment_problem(parser) or _tf_config_problem()
    if problem:
        parser.error(problem)
    args = parser.parse_args(argv)
    if args.check:
        return Launch(None, dry_run=args.dry_run, check=True)
    problem = runner_problem(args, after_plan=False)
    if problem:
        parser.error(problem)
    plan = _plan(parser, job_options(args))
    layout = plan if isinstance(plan, str) else None
    problem = _argument_problem(args) or layout or runner_problem(args, after_plan=True)
    if problem:
        parser.error(problem)
    assert isinstance(plan, JobPlan)
    runner = chosen_runner(args)
    return Launch(plan, dry_run=args.dry_run, runner=runner, runner_options=runner.options(args))


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
    if not math.isfinite(args.timeout) or args.timeout <= 0:
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


def main(argv: Sequence[str] | None = None) -> int:
    """``tfdist-launch``: parses ``argv``, then runs the job with its runner (or prints what
    would run: ``--dry-run``); the job's exit status, 2 for a job that cannot be placed."""
    launch = parse_args(argv)
    if launch.check or launch.plan is None or launch.runner is None:
        from tfdist.launcher.check import format_report, installed_report

        print(format_report(installed_report()))
        return 0
    try:
        if launch.dry_run:
            for line in launch.runner.describe(launch.plan, launch.runner_options):
                print(line)
            return 0
        return launch.runner.run(launch.plan, launch.runner_options)
    except (ClusterConfigError, StrategyConfigError, MissingDependencyError) as err:
        print(f"tfdist-launch: error: {err}", file=sys.stderr)
        return 2
    except LaunchError as err:
        print(f"tfdist-launch: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
