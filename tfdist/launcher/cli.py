"""``tfdist-launch``: start a whole training job on this machine, or show what would start.

Examples::

    tfdist-launch --workers 2 train.py --epochs 3          # multi-worker, 2 processes
    tfdist-launch --ps 1 --workers 2 --evaluator train.py  # parameter server + sidecar evaluator
    tfdist-launch --strategy horovod --workers 2 train.py  # through horovodrun --gloo
    tfdist-launch --strategy horovod --workers 2 --min-workers 1 --max-workers 2 train.py  # elastic
    tfdist-launch --dry-run --workers 2 train.py           # print each task's TF_CONFIG and command
    tfdist-launch --check                                  # what is installed
    tfdist-launch --hosts n1:2,n2:2 --workers 4 train.py   # tasks on n1, n2 (over ssh)
    tfdist-launch --export kubeflow --image me/train:1 --ps 1 train.py  # a Kubeflow TFJob
    tfdist-launch --export slurm --nodes 2 --output job.sbatch train.py  # a Slurm batch script
    tfdist-launch --ray 10.0.0.1:6379 --workers 4 train.py  # one Ray actor per task, as a gang
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence

from tfdist.core.detect import launch_strategy
from tfdist.core.registry import available_strategies, strategy_traits
from tfdist.errors import (
    ClusterConfigError,
    LaunchError,
    MissingDependencyError,
    StrategyConfigError,
    TfdistError,
)
from tfdist.launcher.export import add_export_arguments, check_export_arguments, run_export
from tfdist.launcher.hosts import add_host_arguments, check_host_arguments, host_options_from_args
from tfdist.launcher.plan import JobOptions, JobPlan, layout_problem, place, plan_job
from tfdist.launcher.ray_options import (
    add_ray_arguments,
    check_ray_arguments,
    ray_options_from_args,
)

_ENV_PREFIX = "TFDIST_LAUNCH_"


def _env_default(name: str, default: str) -> str:
    return os.environ.get(_ENV_PREFIX + name, default)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, received {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfdist-launch",
        description="Run a TensorFlow/Keras training script on a distributed topology.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("Examples::", 1)[1],
    )
    job = parser.add_argument_group("job")
    job.add_argument(
        "--strategy", default=_env_default("STRATEGY", "auto"), metavar="NAME",
        help=f"one of {', '.join(available_strategies())}, a registered name, or "
        "package.module:Class (env TFDIST_LAUNCH_STRATEGY; default auto: --ps>0 -> "
        "parameter_server, --workers>1 -> multi_worker, else one process)",
    )
    job.add_argument(
        "--workers", type=int,
        default=os.environ.get(_ENV_PREFIX + "WORKERS"),  # argparse converts (and rejects) it
        help="worker tasks, or Horovod ranks (env TFDIST_LAUNCH_WORKERS; default 1 for the "
        "default and mirrored strategies, which run one process, else 2)",
    )
    job.add_argument(
        "--min-workers", type=int, metavar="A",
        help="horovod, elastic (hvd.elastic.run): the job goes on with as few as A ranks when "
        "ranks die, and a rank starts again on a slot that comes back; with --max-workers")
    job.add_argument("--max-workers", type=int, metavar="B",
                     help="horovod, elastic: the most ranks the job grows to (slots 127.0.1.1 .. "
                     "127.0.1.B; the hosts file the launcher names lists those in use)")
    job.add_argument("--ps", type=int, default=0, help="parameter-server tasks (default 0)")
    chief = job.add_mutually_exclusive_group()
    chief.add_argument("--chief", dest="chief", action="store_true", default=None,
                       help="add a chief task (always on for parameter_server: the coordinator)")
    chief.add_argument("--no-chief", dest="chief", action="store_false")
    job.add_argument("--evaluator", action="store_true",
                     help="add a sidecar evaluator task (its crash does not stop training)")
    job.add_argument(
        "--script-on-all-tasks", action="store_true",
        help="parameter_server: run the script on worker and ps tasks too, instead of tfdist's "
        "own server, for a script written from TensorFlow's guide (its worker/ps branch starts "
        "tf.distribute.Server and joins it, after setting e.g. GRPC_FAIL_FAST)")
    job.add_argument(
        "--evaluator-grace", type=float, default=_env_default("EVALUATOR_GRACE", "60"),
        help="seconds the evaluator may run on after training is done, to evaluate the last "
        "checkpoint, before it is stopped (env TFDIST_LAUNCH_EVALUATOR_GRACE; default 60)",
    )
    pipeline = parser.add_argument_group("pipeline (--strategy pipeline)")
    pipeline.add_argument(
        "--stages", type=_positive_int, metavar="K",
        help="split the model into K stages, one process each; --workers is D x K (D data-"
        "parallel replicas of the pipeline)")
    pipeline.add_argument("--micro-batches", type=_positive_int, metavar="M",
                          help="micro-batches per replica batch (default 1)")
    pipeline.add_argument("--schedule", choices=("gpipe", "1f1b"),
                          help="gpipe (default) or 1f1b (keeps fewer activations)")
    run = parser.add_argument_group("run")
    run.add_argument(
        "--timeout", type=float, default=_env_default("TIMEOUT", "3600"),
        help="seconds before the whole job is stopped (env TFDIST_LAUNCH_TIMEOUT; default 3600)",
    )
    run.add_argument(
        "--startup-timeout", type=float, default=None, metavar="SECONDS",
        help="seconds each task waits for its peers before it stops with a message naming the "
        "missing ones; progress is printed meanwhile (default: $TFDIST_STARTUP_TIMEOUT or 600)",
    )
    run.add_argument(
        "--max-restarts", type=int, default=_env_default("MAX_RESTARTS", "0"),
        help="after a failure, restart the whole job (fresh ports) up to this many times; with "
        "BackupAndRestore in the script, training resumes from the last backup "
        "(env TFDIST_LAUNCH_MAX_RESTARTS; default 0)",
    )
    run.add_argument(
        "--max-worker-restarts", type=int, default=_env_default("MAX_WORKER_RESTARTS", "3"),
        help="parameter_server: restart a dead worker task alone (same TF_CONFIG and port) up to "
        "this many times; a dead ps stops the job (env TFDIST_LAUNCH_MAX_WORKER_RESTARTS; "
        "default 3)",
    )
    run.add_argument(
        "--preemption-grace", type=float, default=_env_default("PREEMPTION_GRACE", "25"),
        metavar="SECONDS",
        help="on SIGTERM the launcher forwards it to every task, which saves at its current step "
        "and exits 75; tasks still running after this many seconds are SIGKILLed. Keep it below "
        "your scheduler's own (Kubernetes terminationGracePeriodSeconds, Slurm KillWait) "
        "(env TFDIST_LAUNCH_PREEMPTION_GRACE; default 25)",
    )
    run.add_argument(
        "--mpi", action="store_true",
        help="horovod: ranks talk over MPI (horovodrun --mpi; shared memory between ranks on one "
        "host) instead of Gloo. Needs OpenMPI and Horovod built with it (bash launch/setup.sh "
        "does both as root)",
    )
    run.add_argument("--log-dir", help="also write each task's whole output to LOG_DIR/<task>.log")
    run.add_argument(
        "-v", "--verbose", action="store_true",
        default=_env_default("VERBOSE", "0") not in ("", "0"),
        help="print every line of every task (TensorFlow's start-up chatter included) and each "
        "task's plan; default: the chief's output, and a failed task's last lines "
        "(env TFDIST_LAUNCH_VERBOSE=1)")
    run.add_argument(
        "--network", choices=("private", "host"), default=_env_default("NETWORK", "private"),
        help="private (default): a job on this machine alone runs its tasks in a network "
        "namespace with only loopback, so no TF server of it can be reached from outside (needs "
        "root; else a warning, and host); host: this machine's network, e.g. for a script that "
        "reads from the network (env TFDIST_LAUNCH_NETWORK)",
    )
    run.add_argument("--dry-run", action="store_true",
                     help="start nothing; print one JSON object per task")
    run.add_argument("--check", action="store_true", help="report what is installed and exit")
    add_export_arguments(parser)
    add_host_arguments(parser)
    add_ray_arguments(parser)
    parser.add_argument("script", nargs="?", help="the training script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses and validates ``argv``; exits with status 2 and a one-line message when invalid.

    ``auto`` is resolved here (``args.strategy`` is a concrete name afterwards), so that every
    check below reads the strategy's traits.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.check:
        return args
    problem = (check_export_arguments(args) or check_ray_arguments(args)
               or _resolve_strategy(args) or _validate(args) or check_host_arguments(args))
    if problem:
        parser.error(problem)
    return args


def _resolve_strategy(args: argparse.Namespace) -> str | None:
    if args.strategy == "auto":
        workers = 2 if args.workers is None else args.workers
        args.strategy = launch_strategy(workers=workers, ps=args.ps,
                                        ranks=args.export == "mpijob", stages=args.stages)
    try:
        traits = strategy_traits(args.strategy)
    except TfdistError as err:
        return str(err)
    if args.workers is None:
        args.workers = 1 if traits.single_process else 2
    if (args.hosts or args.hostfile) and traits.single_process:
        return (f"--strategy {args.strategy} runs one process on this machine; --hosts/--hostfile "
                "need a multi-process strategy. Fix: use multi_worker, parameter_server or horovod")
    return None


def _validate(args: argparse.Namespace) -> str | None:
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
    return layout_problem(options_from_args(args), args.strategy, strategy_traits(args.strategy))


def _unwritable_dir(path: str) -> str | None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        return err.strerror or str(err)
    if not os.access(path, os.W_OK | os.X_OK):
        return "it is not writable"
    return None


def options_from_args(args: argparse.Namespace) -> JobOptions:
    return JobOptions(
        script=args.script, script_args=tuple(args.script_args), strategy=args.strategy,
        workers=args.workers, ps=args.ps, chief=args.chief, evaluator=args.evaluator,
        timeout=args.timeout, evaluator_grace=args.evaluator_grace,
        max_restarts=args.max_restarts, worker_restarts=args.max_worker_restarts,
        log_dir=args.log_dir, hosts=host_options_from_args(args), network=args.network,
        startup_timeout=args.startup_timeout, preemption_grace=args.preemption_grace,
        mpi=args.mpi,
        verbose=args.verbose, script_on_all_tasks=args.script_on_all_tasks,
        min_workers=args.min_workers, max_workers=args.max_workers,
        strategy_options={option: str(getattr(args, option))
                          for option in ("stages", "micro_batches", "schedule")
                          if getattr(args, option) is not None},
    )


def plan_from_args(args: argparse.Namespace) -> JobPlan:
    """The `JobPlan` of parsed arguments: what every runner and export reads."""
    return plan_job(options_from_args(args))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.check:
        from tfdist.launcher.check import format_report, installed_report

        print(format_report(installed_report()))
        return 0
    try:
        plan = plan_from_args(args)
        if args.export:
            return run_export(args, plan)
        if args.ray is not None:
            return _run_on_ray(args, plan)
        placement = place(plan)
    except (ClusterConfigError, StrategyConfigError, MissingDependencyError) as err:
        print(f"tfdist-launch: error: {err}", file=sys.stderr)
        return 2
    if args.dry_run:
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


def _run_on_ray(args: argparse.Namespace, plan: JobPlan) -> int:
    from tfdist.launcher.ray_runner import describe, run_on_ray

    if args.dry_run:
        for line in describe(plan, ray_options_from_args(args)):
            print(json.dumps(line))
        return 0
    try:
        return run_on_ray(plan, ray_options_from_args(args))
    except (LaunchError, MissingDependencyError) as err:
        print(f"tfdist-launch: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
