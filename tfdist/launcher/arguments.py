"""``tfdist-launch``'s parser, one function per argument group of the job (each runner adds its
own: `tfdist.launcher.runners`; environment defaults named in ``--help``:
``TFDIST_LAUNCH_<NAME>``), and `job_options`, which turns what it parsed into typed
options (`tfdist.launcher.options`) at once: nothing after it reads the namespace.

`environment_problem` checks the ``TFDIST_LAUNCH_*`` variables before the command line is read:
an unknown name (a typo would otherwise be ignored, e.g. ``TFDIST_LAUNCH_NETWROK=host``) or a
value its option would refuse (``TFDIST_LAUNCH_NETWORK=privte`` would otherwise pass argparse,
which checks choices only for values given on the command line) is named with the variable.

Example:
    >>> args = build_parser().parse_args(["--workers", "2", "train.py", "--stages", "2"])
    >>> args.script_args
    ['--stages', '2']
    >>> args = build_parser().parse_args(["--workers", "2", "--stages", "2", "train.py"])
    >>> options = job_options(args).strategy_options
    >>> options.stages, options.tensor, options.micro_batches, options.schedule, options.chunks
    (2, None, None, None, None)
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from tfdist.core.registry import available_strategies
from tfdist.launcher.export import export_options
from tfdist.launcher.hosts import host_options
from tfdist.launcher.options import JobOptions, StrategyOptions
from tfdist.launcher.ray import ray_options
from tfdist.launcher.runners import ENV_PREFIX, environment_default, registered_runners
from tfdist.pipeline.config import BATCH_NORM_POLICIES
from tfdist.pipeline.schedule import SCHEDULES

__all__ = ["ENV_PREFIX", "JOB_ENVIRONMENT", "build_parser", "environment_defaults",
           "environment_problem", "job_options"]

JOB_ENVIRONMENT = (
    "STRATEGY", "WORKERS", "EVALUATOR_GRACE", "TIMEOUT", "MAX_RESTARTS", "MAX_WORKER_RESTARTS",
    "PREEMPTION_GRACE", "VERBOSE", "NETWORK")
"""The job's options whose default ``TFDIST_LAUNCH_<NAME>`` sets (``--<name>``, ``_`` as ``-``);
each runner names its own (`Runner.environment`)."""
_SWITCH_VALUES = ("", "0", "1", "false", "true", "no", "yes")


def environment_defaults() -> tuple[str, ...]:
    """Every ``TFDIST_LAUNCH_<NAME>`` the parser reads: the job's, then each runner's.

    Example:
        >>> environment_defaults()[:2], environment_defaults()[-2:]
        (('STRATEGY', 'WORKERS'), ('NETWORK_INTERFACE', 'RAY'))
    """
    return (*JOB_ENVIRONMENT, *(name for runner in registered_runners()
                                for name in runner.environment))


def _env_default(name: str, default: str) -> str:
    assert name in JOB_ENVIRONMENT, name
    value = environment_default(name, default)
    assert value is not None
    return value


def _env_or_none(name: str) -> str | None:
    assert name in JOB_ENVIRONMENT, name
    return environment_default(name)


def environment_problem(parser: argparse.ArgumentParser,
                        environ: Mapping[str, str] = os.environ) -> str | None:
    """What is wrong with the ``TFDIST_LAUNCH_*`` variables in ``environ``, or None: each is
    checked as its option checks a value given on the command line.

    Example:
        >>> parser = build_parser()
        >>> environment_problem(parser, {"TFDIST_LAUNCH_NETWORK": "privte"}).split(". Fix")[0]
        "TFDIST_LAUNCH_NETWORK='privte' is not a value of --network: expected one of private, host"
        >>> environment_problem(parser, {"TFDIST_LAUNCH_NETWROK": "host"})[:46]
        'TFDIST_LAUNCH_NETWROK is not a variable tfdist'
        >>> environment_problem(parser, {"TFDIST_LAUNCH_TIMEOUT": "90", "HOME": "/root"})
    """
    known = environment_defaults()
    options = {f"--{name.lower().replace('_', '-')}": name for name in known}
    actions = {flag: action for action in parser._actions for flag in action.option_strings
               if flag in options}
    for variable in sorted(environ):
        if not variable.startswith(ENV_PREFIX):
            continue
        name = variable[len(ENV_PREFIX):]
        if name not in known:
            return (f"{variable} is not a variable tfdist-launch reads (a typo would be "
                    f"ignored). Fix: unset it, or use one of "
                    f"{', '.join(ENV_PREFIX + each for each in known)}")
        flag = f"--{name.lower().replace('_', '-')}"
        expected = _value_problem(actions[flag], environ[variable])
        if expected:
            return (f"{variable}={environ[variable]!r} is not a value of {flag}: expected "
                    f"{expected}. Fix: export {variable} with such a value, or unset it")
    return None


def _value_problem(action: argparse.Action, text: str) -> str | None:
    """What ``action`` expects, if it would refuse ``text``; None if it takes it."""
    if isinstance(action, argparse._StoreTrueAction):
        return None if text.strip().lower() in _SWITCH_VALUES else "1 or 0 (true or false)"
    try:
        value = action.type(text) if action.type else text
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        return _KINDS.get(action.type, "a value --help describes")
    if action.choices is not None and value not in action.choices:
        return f"one of {', '.join(map(str, action.choices))}"
    return None


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, received {value}")
    return value


_KINDS = {int: "an integer", float: "a number", _positive_int: "an integer >= 1"}


def build_parser(epilog: str = "") -> argparse.ArgumentParser:
    """``tfdist-launch``'s whole parser: the job's groups, then each registered runner's
    (`tfdist.launcher.runners`); ``epilog`` (examples) is printed after ``--help``."""
    parser = argparse.ArgumentParser(
        prog="tfdist-launch",
        description="Run a TensorFlow/Keras training script on a distributed topology.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=epilog,
    )
    for add_group in (_add_job_arguments, _add_pipeline_arguments, _add_run_arguments):
        add_group(parser)
    for runner in registered_runners():
        runner.add_arguments(parser)
    parser.add_argument("script", nargs="?", help="the training script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    return parser


def _add_job_arguments(parser: argparse.ArgumentParser) -> None:
    job = parser.add_argument_group("job")
    job.add_argument(
        "--strategy", default=_env_default("STRATEGY", "auto"), metavar="NAME",
        help=f"one of {', '.join(available_strategies())}, a registered name, or "
        "package.module:Class (env TFDIST_LAUNCH_STRATEGY; default auto: --ps>0 -> "
        "parameter_server, --workers>1 -> multi_worker, else one process)",
    )
    job.add_argument(
        "--workers", type=int,
        default=_env_or_none("WORKERS"),  # argparse converts it; environment_problem checks
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
    _add_task_arguments(job)


def _add_task_arguments(job: argparse._ArgumentGroup) -> None:
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


def _add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    pipeline = parser.add_argument_group("pipeline (--strategy pipeline)")
    pipeline.add_argument(
        "--stages", type=_positive_int, metavar="K",
        help="split the model into K stages, one process each; --workers is D x K (D data-"
        "parallel replicas of the pipeline)")
    pipeline.add_argument("--micro-batches", type=_positive_int, metavar="M",
                          help="micro-batches per replica batch (default 1)")
    pipeline.add_argument("--schedule", choices=tuple(SCHEDULES), help="; ".join(
        f"{name}: {cls.summary}" for name, cls in SCHEDULES.items()))
    pipeline.add_argument("--chunks", type=_positive_int, metavar="V",
                          help="model chunks per process with --schedule interleaved (the "
                          "model is cut into K x V pieces)")
    pipeline.add_argument(
        "--batch-norm", choices=BATCH_NORM_POLICIES, metavar="POLICY",
        help="BatchNormalization with --micro-batches > 1: 'refuse' (default) or "
        "'per_micro_batch' (GPipe's: each micro-batch normalised by its own statistics, the "
        "moving averages updated M times a step); the tasks read it from "
        "TFDIST_PIPELINE_BATCH_NORM, as get_strategy(batch_norm=...)")
    tensor = parser.add_argument_group("tensor (--strategy tensor, or pipeline with --stages)")
    tensor.add_argument(
        "--tensor", type=_positive_int, metavar="T",
        help="split each layer (attention heads, feed-forward widths, vocabulary) T ways, one "
        "process each; --workers is D x K x T (D data-parallel replicas of K stages, each on T "
        "neighbouring processes of one host); each task reads its place from TFDIST_MESH")
    zero = parser.add_argument_group("ZeRO (--strategy multi_worker, or pipeline; Keras 3)")
    zero.add_argument(
        "--zero", type=int, choices=(1, 2, 3), metavar="{1,2,3}",
        help="shard over the D workers: 1 the optimizer state, 2 also the gradients "
        "(reduce-scattered), 3 also the weights (gathered each step); with --strategy pipeline "
        "(1 or 2) each stage over its D replicas; each task reads it from TFDIST_ZERO; the "
        "script builds its model with strategy.build_model")


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    run = parser.add_argument_group("run")
    run.add_argument(
        "--timeout", type=float, default=_env_or_none("TIMEOUT"), metavar="SECONDS",
        help="seconds before the whole job is stopped, healthy or not (env "
        "TFDIST_LAUNCH_TIMEOUT; default: none, the job runs as long as it trains: a task that "
        "dies, a peer that never joins (--startup-timeout) or a step stuck past its deadline "
        "stops it)",
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
    _add_run_switches(run)


def _add_run_switches(run: argparse._ArgumentGroup) -> None:
    run.add_argument(
        "--mpi", action="store_true",
        help="horovod: ranks talk over MPI (horovodrun --mpi; shared memory between ranks on one "
        "host) instead of Gloo. Needs OpenMPI and Horovod built with it (bash launch/setup.sh "
        "does both as root)",
    )
    run.add_argument("--log-dir", help="also write each task's whole output to LOG_DIR/<task>.log")
    run.add_argument(
        "-v", "--verbose", action="store_true",
        default=_env_default("VERBOSE", "0").strip().lower() not in ("", "0", "false", "no"),
        help="print every line of every task (TensorFlow's start-up chatter included) and each "
        "task's plan; default: the chief's output, and a failed task's last lines "
        "(env TFDIST_LAUNCH_VERBOSE=1)")
    run.add_argument(
        "-q", "--quiet", action="store_true",
        help="leave out tfdist's own info lines in the tasks (the strategy chosen, the tensor "
        "and pipeline plans); warnings and errors still show")
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


def job_options(args: argparse.Namespace) -> JobOptions:
    """The typed options of a parsed command line (a missing script is ``""``; the CLI's
    checks name it)."""
    return JobOptions(
        script=args.script or "", script_args=tuple(args.script_args), strategy=args.strategy,
        workers=args.workers, ps=args.ps, chief=args.chief, evaluator=args.evaluator,
        timeout=args.timeout, evaluator_grace=args.evaluator_grace,
        max_restarts=args.max_restarts, worker_restarts=args.max_worker_restarts,
        log_dir=args.log_dir, hosts=host_options(args), network=args.network,
        startup_timeout=args.startup_timeout, preemption_grace=args.preemption_grace,
        mpi=args.mpi, verbose=args.verbose, quiet=args.quiet,
        script_on_all_tasks=args.script_on_all_tasks,
        min_workers=args.min_workers, max_workers=args.max_workers,
        strategy_options=StrategyOptions(stages=args.stages, tensor=args.tensor,
                                         micro_batches=args.micro_batches,
                                         schedule=args.schedule, chunks=args.chunks,
                                         batch_norm=args.batch_norm, zero=args.zero),
        export=export_options(args), ray=ray_options(args),
    )
