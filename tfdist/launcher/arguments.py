"""``tfdist-launch``'s parser, one function per argument group (environment defaults named in
``--help``: ``TFDIST_LAUNCH_<NAME>``), and `job_options`, which turns what it parsed into typed
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
import dataclasses
import os
from collections.abc import Mapping

from tfdist.cluster.hosts import DEFAULT_BASE_PORT
from tfdist.core.registry import available_strategies
from tfdist.launcher.hosts import HostOptions
from tfdist.launcher.options import EXPORT_FORMATS, ExportOptions, JobOptions, StrategyOptions
from tfdist.launcher.ray_options import RayOptions
from tfdist.launcher.ssh import SshOptions
from tfdist.pipeline.schedule import SCHEDULES

__all__ = ["ENV_PREFIX", "ENVIRONMENT_DEFAULTS", "EXPORT_ONLY", "build_parser",
           "environment_problem", "job_options", "export_options", "ray_options",
           "host_options"]

ENV_PREFIX = "TFDIST_LAUNCH_"
ENVIRONMENT_DEFAULTS = (
    "STRATEGY", "WORKERS", "EVALUATOR_GRACE", "TIMEOUT", "MAX_RESTARTS", "MAX_WORKER_RESTARTS",
    "PREEMPTION_GRACE", "VERBOSE", "NETWORK", "HOSTS", "HOSTFILE", "SSH_PORT", "SSH_IDENTITY",
    "SSH_KNOWN_HOSTS", "NETWORK_INTERFACE", "RAY")
"""The options whose default ``TFDIST_LAUNCH_<NAME>`` sets (``--<name>``, ``_`` as ``-``)."""
_SWITCH_VALUES = ("", "0", "1", "false", "true", "no", "yes")


def _env_default(name: str, default: str) -> str:
    assert name in ENVIRONMENT_DEFAULTS, name
    return os.environ.get(ENV_PREFIX + name, default)


def _env_or_none(name: str) -> str | None:
    assert name in ENVIRONMENT_DEFAULTS, name
    return os.environ.get(ENV_PREFIX + name) or None


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
    options = {f"--{name.lower().replace('_', '-')}": name for name in ENVIRONMENT_DEFAULTS}
    actions = {flag: action for action in parser._actions for flag in action.option_strings
               if flag in options}
    for variable in sorted(environ):
        if not variable.startswith(ENV_PREFIX):
            continue
        name = variable[len(ENV_PREFIX):]
        if name not in ENVIRONMENT_DEFAULTS:
            return (f"{variable} is not a variable tfdist-launch reads (a typo would be "
                    f"ignored). Fix: unset it, or use one of "
                    f"{', '.join(ENV_PREFIX + known for known in ENVIRONMENT_DEFAULTS)}")
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
    """``tfdist-launch``'s whole parser; ``epilog`` (examples) is printed after ``--help``."""
    parser = argparse.ArgumentParser(
        prog="tfdist-launch",
        description="Run a TensorFlow/Keras training script on a distributed topology.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=epilog,
    )
    for add_group in (_add_job_arguments, _add_pipeline_arguments, _add_run_arguments,
                      _add_export_arguments, _add_host_arguments, _add_ray_arguments):
        add_group(parser)
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
    tensor = parser.add_argument_group("tensor (--strategy tensor, or pipeline with --stages)")
    tensor.add_argument(
        "--tensor", type=_positive_int, metavar="T",
        help="split each layer (attention heads, feed-forward widths, vocabulary) T ways, one "
        "process each; --workers is D x K x T (D data-parallel replicas of K stages, each on T "
        "neighbouring processes of one host); each task reads its place from TFDIST_MESH")


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
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
        "--network", choices=("private", "host"), default=_env_default("NETWORK", "private"),
        help="private (default): a job on this machine alone runs its tasks in a network "
        "namespace with only loopback, so no TF server of it can be reached from outside (needs "
        "root; else a warning, and host); host: this machine's network, e.g. for a script that "
        "reads from the network (env TFDIST_LAUNCH_NETWORK)",
    )
    run.add_argument("--dry-run", action="store_true",
                     help="start nothing; print one JSON object per task")
    run.add_argument("--check", action="store_true", help="report what is installed and exit")


def _add_export_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("export (write a scheduler job instead of running)")
    group.add_argument("--export", choices=EXPORT_FORMATS,
                       help="print (or --output) a Kubeflow TFJob, an MPIJob, or a Slurm script")
    group.add_argument("--image", help="container image for kubeflow/mpijob (default "
                       "tfdist:latest)")
    group.add_argument("--output", help="write the export to this file instead of stdout")
    group.add_argument("--name", help="job name (default: the script's name)")
    group.add_argument("--nodes", type=int, help="slurm: nodes (default 1)")
    group.add_argument("--slots-per-worker", type=int,
                       help="mpijob: Horovod ranks per worker pod (default 1)")


def _add_host_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("hosts (tasks on other machines, started over ssh)")
    group.add_argument(
        "--hosts", default=_env_or_none("HOSTS"), metavar="H1:SLOTS,H2:SLOTS",
        help="run the tasks on these hosts, slots filled host-major: chief, workers, ps, "
        "evaluator (env TFDIST_LAUNCH_HOSTS)",
    )
    group.add_argument(
        "--hostfile", default=_env_or_none("HOSTFILE"), metavar="FILE",
        help="like --hosts, one 'host:slots' or 'host slots=N' per line (env "
        "TFDIST_LAUNCH_HOSTFILE)",
    )
    group.add_argument("--base-port", type=int, default=None,
                       help="TF server port of each host's first slot; the next slots take the "
                       f"next ports (default {DEFAULT_BASE_PORT})")
    group.add_argument("--ssh-port", type=int, default=_env_or_none("SSH_PORT"),
                       help="ssh port of the hosts (env TFDIST_LAUNCH_SSH_PORT; default: ssh's)")
    group.add_argument("--ssh-identity", default=_env_or_none("SSH_IDENTITY"), metavar="KEY",
                       help="private key for ssh -i (env TFDIST_LAUNCH_SSH_IDENTITY)")
    group.add_argument("--ssh-known-hosts", default=_env_or_none("SSH_KNOWN_HOSTS"), metavar="FILE",
                       help="check the hosts' keys against this file (default: ssh's own known "
                       "hosts; env TFDIST_LAUNCH_SSH_KNOWN_HOSTS)")
    group.add_argument("--no-host-key-check", action="store_true",
                       help="accept any host key: only on a network you trust (a machine in the "
                       "middle could impersonate the hosts)")
    group.add_argument("--env", dest="env_names", action="append", default=[], metavar="NAME",
                       help="also give remote tasks (--hosts, --ray) this variable of the "
                       "launcher's environment (repeatable; never on a command line)")
    group.add_argument("--network-interface", default=_env_or_none("NETWORK_INTERFACE"),
                       metavar="IFACE",
                       help="horovod: the interface the ranks talk over, same name on every host "
                       "(env TFDIST_LAUNCH_NETWORK_INTERFACE; default: the one this machine "
                       "reaches the first remote host by)")


def _add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("ray (run the job on a Ray cluster)")
    group.add_argument(
        "--ray", nargs="?", const="auto", default=_env_or_none("RAY"),
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
        mpi=args.mpi, verbose=args.verbose, script_on_all_tasks=args.script_on_all_tasks,
        min_workers=args.min_workers, max_workers=args.max_workers,
        strategy_options=StrategyOptions(stages=args.stages, tensor=args.tensor,
                                         micro_batches=args.micro_batches,
                                         schedule=args.schedule, chunks=args.chunks),
        export=export_options(args), ray=ray_options(args),
    )


def export_options(args: argparse.Namespace) -> ExportOptions | None:
    """``--export`` and its settings, defaults filled (None: no ``--export``)."""
    if not args.export:
        return None
    defaults = ExportOptions(args.export)
    given = {name: getattr(args, name) for name in EXPORT_ONLY if getattr(args, name) is not None}
    return dataclasses.replace(defaults, **given)


EXPORT_ONLY = ("image", "output", "name", "nodes", "slots_per_worker")
"""Options that only mean something with ``--export`` (their defaults: `ExportOptions`)."""


def ray_options(args: argparse.Namespace) -> RayOptions | None:
    """``--ray`` and its settings (None: no ``--ray``; raises ValueError for a bad value)."""
    if args.ray is None:
        return None
    return RayOptions(address=args.ray, cpus_per_task=args.ray_cpus_per_task,
                      placement=args.ray_placement, gang_timeout=args.ray_gang_timeout,
                      env_names=tuple(args.env_names))


def host_options(args: argparse.Namespace) -> HostOptions | None:
    """The `HostOptions` of parsed arguments (None when no hosts were given)."""
    if not (args.hosts or args.hostfile):
        return None
    port = int(args.ssh_port) if args.ssh_port is not None else None
    return HostOptions(
        hosts=args.hosts or None, hostfile=args.hostfile or None,
        base_port=args.base_port if args.base_port is not None else DEFAULT_BASE_PORT,
        ssh=SshOptions(port=port, identity=args.ssh_identity, known_hosts=args.ssh_known_hosts,
                       check_host_keys=not args.no_host_key_check),
        network_interface=args.network_interface or None, env_names=tuple(args.env_names),
    )
