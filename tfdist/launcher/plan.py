"""A job, decided once: `plan_job` turns what the user asked for into the `JobPlan` runners read.

Two steps, so that nothing is decided twice:

1. `plan_job` (`JobOptions` -> `JobPlan`): the strategy (``auto`` resolved), its traits, the tasks
   per role, what each role runs, the environment every task gets, and how the job is run
   (timeout, restarts, logs, hosts). No ports, no processes: the Kubeflow, MPIJob and Slurm
   exports read this alone.
2. `place` (`JobPlan` -> `Placement`): the processes that start on this machine (or over ssh):
   ports reserved, one TF_CONFIG each, argv, kind. ``--dry-run`` prints the very placement that
   runs, and each gang restart places the same plan again on fresh ports.

Example:
    >>> plan = plan_job(JobOptions("train.py", workers=2, ps=1))
    >>> plan.strategy, plan.roles
    ('parameter_server', {'chief': 1, 'worker': 2, 'ps': 1})
    >>> plan.task_argv("ps", python="python")
    ('python', '-u', '-m', 'tfdist.server')
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from tfdist.cluster import ClusterSpec, Task, release_ports
from tfdist.cluster.roles import ROLES
from tfdist.core.detect import launch_strategy
from tfdist.core.registry import strategy_traits
from tfdist.core.traits import STRATEGY_ENV, StrategyTraits, TaskKind
from tfdist.errors import StrategyConfigError, TfdistError
from tfdist.horovod.checks import check_controller
from tfdist.launcher.elastic import (
    HOSTS_FILE_ENV,
    Discovery,
    elastic_args,
    elastic_problem,
    slot_addresses,
)
from tfdist.launcher.hosts import (
    HostOptions,
    has_remote_host,
    horovodrun_host_args,
    host_cluster,
    rank_hosts,
    task_command,
)
from tfdist.pipeline.layout import check_processes
from tfdist.strategies.startup import STARTUP_TIMEOUT_ENV

__all__ = [
    "STRATEGY_ENV",
    "JobOptions",
    "JobPlan",
    "TaskPlan",
    "Placement",
    "plan_job",
    "layout_problem",
    "place",
    "horovodrun_path",
]


@dataclasses.dataclass(frozen=True)
class JobOptions:
    """What the user asked for, after parsing (see `tfdist.launcher.cli`).

    Attributes:
        script: The training script.
        script_args: Its arguments.
        strategy: A strategy name, ``package.module:Class``, or ``"auto"``.
        workers: Worker tasks, or Horovod ranks.
        ps: Parameter-server tasks.
        chief: Add a chief (None: the strategy's default).
        evaluator: Add a sidecar evaluator.
        timeout: Seconds before the whole job is stopped.
        evaluator_grace: Seconds the evaluator may run on after training is done.
        max_restarts: Gang restarts after a failure.
        worker_restarts: Restarts of each task whose role the strategy restarts alone.
        log_dir: Where each task's output is also written (None: nowhere).
        hosts: ``--hosts``/``--hostfile``: tasks on these machines (ssh).
        network: ``private``: a job on this machine alone runs in a network namespace with
            only loopback (`tfdist.launcher.netns`); ``host``: on this machine's network.
        startup_timeout: Seconds each task waits for its peers (``TFDIST_STARTUP_TIMEOUT``;
            None: the tasks' default, 600 s).
        strategy_options: Options of the strategy itself (``{"stages": "2"}``), among its
            ``traits.launch_options``; each reaches the tasks as that variable.
        mpi: Horovod ranks talk over MPI (``horovodrun --mpi``: shared memory between ranks on
            one host) instead of Gloo.
        preemption_grace: Seconds tasks get, after the launcher forwards a SIGTERM, to save and
            exit before they are SIGKILLed (`tfdist.preemption`).
        verbose: Print every line of every task, and each task's plan, as they come (default:
            the chief's output less TensorFlow's start-up chatter; `tfdist.launcher.output`).
        script_on_all_tasks: Run the script on the strategy's server roles too (ParameterServer
            ``worker`` and ``ps``), instead of ``python -m tfdist.server``: for a script that
            serves them itself, as TensorFlow's guide writes it.
        min_workers: Elastic Horovod: the fewest ranks the job goes on with (None: not elastic;
            `tfdist.launcher.elastic`).
        max_workers: Elastic Horovod: the most ranks the job grows to.
    """

    script: str
    script_args: tuple[str, ...] = ()
    strategy: str = "auto"
    workers: int = 2
    ps: int = 0
    chief: bool | None = None
    evaluator: bool = False
    timeout: float = 3600.0
    evaluator_grace: float = 60.0
    max_restarts: int = 0
    worker_restarts: int = 3
    log_dir: str | None = None
    hosts: HostOptions | None = None
    network: Literal["private", "host"] = "private"
    startup_timeout: float | None = None
    strategy_options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    preemption_grace: float = 25.0
    mpi: bool = False
    verbose: bool = False
    script_on_all_tasks: bool = False
    min_workers: int | None = None
    max_workers: int | None = None

    @property
    def elastic(self) -> bool:
        """Whether the job's size may change while it runs (``--min-workers``/``--max-workers``)."""
        return self.min_workers is not None or self.max_workers is not None


@dataclasses.dataclass(frozen=True)
class JobPlan:
    """One job, as every runner sees it: strategy, tasks per role, commands, environment.

    Attributes:
        strategy: The concrete strategy (``auto`` resolved).
        traits: Its traits (read from the registry once).
        roles: Tasks per role in start order (a single-process job: one ``chief``; Horovod: one
            ``worker`` per rank).
        script_argv: The script and its arguments.
        env: Variables every task gets (TF_CONFIG aside), independent of where it runs.
        options: What the user asked for (run settings, hosts).
    """

    strategy: str
    traits: StrategyTraits
    roles: Mapping[str, int]
    script_argv: tuple[str, ...]
    env: Mapping[str, str]
    options: JobOptions

    def tasks(self) -> list[Task]:
        """Every task of the job, in start order."""
        return [Task(role, i) for role, count in self.roles.items() for i in range(count)]

    def task_argv(self, role: str, python: str = sys.executable) -> tuple[str, ...]:
        """What a ``role`` task runs: the script, or ``python -m tfdist.server`` (traits)."""
        return self.traits.task_argv(role, self.script_argv, python,
                                     script_serves=self.options.script_on_all_tasks)

    def task_kind(self, role: str) -> TaskKind:
        return self.traits.task_kind(role)

    def restarts(self, role: str) -> int:
        """How many times a dead ``role`` task is restarted alone while the job goes on."""
        return self.options.worker_restarts if role in self.traits.restarted_alone else 0

    def loss_is_fatal(self, role: str) -> str | None:
        """Why losing a ``role`` task ends the job, where the strategy says it does."""
        return self.traits.fatal_roles.get(role)


@dataclasses.dataclass(frozen=True)
class TaskPlan:
    """One process of a placed job.

    Attributes:
        name: ``"worker:1"``; for a Horovod job the single ``horovodrun`` process.
        task: The task it runs (None for the ``horovodrun`` process itself).
        host: Where it runs.
        tf_config: The TF_CONFIG object it gets, or None (Horovod ranks, single-process jobs).
        command: Its argv.
        kind: ``"main"``, ``"service"`` or ``"sidecar"`` (see `ProcessGroup`).
        env: Variables added to the launcher's environment for this process.
        unset_env: Variables of the launcher's environment this process does not get.
        max_restarts: Times it is restarted alone when it dies (the rest of the job goes on).
        stdin: Written to its stdin at start (a remote task's environment), else nothing.
    """

    name: str
    task: Task | None
    host: str
    tf_config: dict[str, Any] | None
    command: tuple[str, ...]
    kind: TaskKind = "main"
    env: tuple[tuple[str, str], ...] = ()
    unset_env: tuple[str, ...] = ()
    max_restarts: int = 0
    stdin: str | None = None

    def environ(self) -> dict[str, str]:
        """This process's whole environment: the launcher's, less `unset_env`, plus `env`."""
        inherited = {k: v for k, v in os.environ.items() if k not in self.unset_env}
        return {**inherited, **dict(self.env)}

    def describe(self) -> dict[str, Any]:
        """The JSON object ``--dry-run`` prints for this task."""
        task = {"type": self.task.type, "index": self.task.index} if self.task else None
        return {
            "task": task,
            "host": self.host,
            "tf_config": self.tf_config,
            "command": list(self.command),
            "kind": self.kind,
            "env": dict(self.env),
            "unset_env": list(self.unset_env),
        }


@dataclasses.dataclass(frozen=True)
class Placement:
    """The processes of one run of a `JobPlan`, and the cluster they form (None: one process).

    Horovod ranks are started by ``horovodrun`` (the one task); they are in ``ranks`` so that
    ``--dry-run`` shows them. An elastic job's ranks are those it starts with; its ``discovery``
    (script and hosts file) lives until `release`, and ``--dry-run`` shows ``horovodrun`` too.
    """

    plan: JobPlan
    tasks: tuple[TaskPlan, ...]
    cluster: ClusterSpec | None = None
    ranks: tuple[TaskPlan, ...] = ()
    discovery: Discovery | None = None

    def describe(self) -> list[dict[str, Any]]:
        lines = [t.describe() for t in (self.ranks or self.tasks)]
        if self.discovery is not None:
            options = self.plan.options
            elastic = {"min_workers": options.min_workers, "max_workers": options.max_workers,
                       "hosts_file": self.discovery.hosts_file,
                       "slots": list(self.loopback_addresses)}
            lines.append({**self.tasks[0].describe(), "elastic": elastic})
        return lines

    @property
    def loopback_addresses(self) -> tuple[str, ...]:
        """Extra loopback addresses its private network needs (an elastic job's slots)."""
        if self.discovery is None or self.plan.options.max_workers is None:
            return ()
        return slot_addresses(self.plan.options.max_workers)

    @property
    def private_network(self) -> bool:
        """Whether its processes should share a loopback-only network (`tfdist.launcher.netns`):
        several processes, all on this machine, and ``network="private"``."""
        options = self.plan.options
        return options.network == "private" and options.hosts is None and (
            self.cluster is not None or bool(self.ranks))

    def release(self) -> None:
        """Releases the ports this placement holds (after its run, or when it will not run)."""
        if self.cluster is not None:
            release_ports(self.cluster.ports())
        if self.discovery is not None:
            self.discovery.remove()


def plan_job(options: JobOptions, environ: Mapping[str, str] | None = None) -> JobPlan:
    """Decides the job: strategy, traits, tasks per role, environment. Starts and binds nothing.

    Args:
        options: What the user asked for.
        environ: The launcher's environment (default ``os.environ``): a user's own
            ``TF_USE_LEGACY_KERAS`` and ``TF_CPP_MIN_LOG_LEVEL`` are kept.

    Raises:
        StrategyConfigError: The strategy is unknown.
    """
    environ = os.environ if environ is None else environ
    strategy = options.strategy
    if strategy == "auto":
        stages = options.strategy_options.get("stages")
        strategy = launch_strategy(workers=options.workers, ps=options.ps,
                                   stages=None if stages is None else int(stages))
    traits = strategy_traits(strategy)
    problem = layout_problem(options, strategy, traits)
    if problem:
        raise StrategyConfigError(problem)
    env = {
        **traits.task_env(strategy, environ),
        "PYTHONUNBUFFERED": "1",
        # TensorFlow's C++ INFO/WARNING lines drown the training output; set 0 to see them.
        "TF_CPP_MIN_LOG_LEVEL": environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
    }
    if options.startup_timeout is not None:
        env[STARTUP_TIMEOUT_ENV] = f"{options.startup_timeout:g}"
    for option, value in options.strategy_options.items():
        env[traits.launch_options[option]] = value
    script_argv = (options.script, *options.script_args)
    return JobPlan(strategy, traits, _roles(options, traits), script_argv, env, options)


def layout_problem(options: JobOptions, strategy: str, traits: StrategyTraits) -> str | None:
    """What is wrong with the asked tasks for ``strategy``, as a one-line message, or None.

    Example:
        >>> from tfdist.core.traits import HOROVOD
        >>> layout_problem(JobOptions("t.py", evaluator=True), "horovod", HOROVOD)[:46]
        '--evaluator was given with --strategy horovod,'
    """
    if options.workers < 1:
        return f"--workers must be at least 1. Received: {options.workers}"
    if options.ps < 0:
        return f"--ps must be 0 or more. Received: {options.ps}"
    if traits.single_process and options.workers > 1:
        return (f"--strategy {strategy} runs one process (several devices in it), but "
                f"--workers {options.workers} was given. Fix: use --strategy multi_worker")
    if options.ps and not traits.has_role("ps"):
        return (f"--ps {options.ps} was given with --strategy {strategy}, which has no parameter "
                f"servers. Fix: drop --ps, or use --strategy parameter_server")
    for role, why in traits.required_roles.items():
        if role == "ps" and not options.ps:
            return f"--strategy {strategy} needs --ps 1 or more ({why})"
    if options.chief is False and traits.chief_required:
        why = traits.required_roles.get("chief", "the job needs one")
        return f"--no-chief with {strategy}: {why}. Fix: drop --no-chief"
    if options.script_on_all_tasks and not traits.server_roles:
        return (f"--script-on-all-tasks was given with --strategy {strategy}, whose every task "
                "already runs the script. Fix: drop --script-on-all-tasks (it is for "
                "parameter_server scripts that serve their own worker and ps tasks)")
    problem = (_strategy_options_problem(options, strategy, traits)
               or _mpi_problem(options, strategy, traits)
               or elastic_problem(options, strategy, traits))
    if problem:
        return problem
    flags = {"evaluator": "--evaluator" if options.evaluator else None,
             "chief": "--chief" if options.chief and not traits.single_process else None}
    for role, flag in flags.items():
        if flag and not traits.has_role(role):
            return (f"{flag} was given with --strategy {strategy}, which has no {role} task. "
                    f"Fix: drop {flag}, or use a strategy with one (multi_worker, "
                    "parameter_server)")
    return None


def _mpi_problem(options: JobOptions, strategy: str, traits: StrategyTraits) -> str | None:
    if not options.mpi:
        return None
    if traits.launch != "ranks":
        return (f"--mpi was given with --strategy {strategy}, whose tasks are not Horovod ranks. "
                "Fix: drop --mpi, or use --strategy horovod")
    return None


def _check_mpirun() -> None:
    """``horovodrun --mpi`` starts ranks with OpenMPI's mpirun (not needed to export a job)."""
    if shutil.which("mpirun") is None:
        raise StrategyConfigError(
            "--mpi needs OpenMPI's mpirun, which is not on PATH. Fix: apt-get install "
            "openmpi-bin libopenmpi-dev, then bash launch/setup.sh (Horovod is rebuilt with "
            "MPI), or drop --mpi to use Gloo")


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def _strategy_options_problem(
    options: JobOptions, strategy: str, traits: StrategyTraits
) -> str | None:
    for option in options.strategy_options:
        if option not in traits.launch_options:
            takes = ", ".join(_flag(o) for o in traits.launch_options) or "none"
            return (f"{_flag(option)} was given with --strategy {strategy}, which does not take "
                    f"it (it takes: {takes}). Fix: drop {_flag(option)}, or use --strategy "
                    "pipeline")
    stages = options.strategy_options.get("stages")
    if stages is not None:
        processes = options.workers + int(traits.chief(options.chief))
        try:
            check_processes(processes, int(stages))
        except TfdistError as err:
            return f"--stages {stages} with {processes} process(es): {err}"
    return None


def _roles(options: JobOptions, traits: StrategyTraits) -> dict[str, int]:
    if traits.single_process:
        return {"chief": 1}
    asked = {"chief": int(traits.chief(options.chief)), "worker": options.workers,
             "ps": options.ps, "evaluator": int(options.evaluator)}
    return {role: asked[role] for role in ROLES if asked[role] and traits.has_role(role)}


def place(plan: JobPlan) -> Placement:
    """Lays ``plan`` out on this machine (or its hosts): ports reserved now, held until released.

    Raises:
        ClusterConfigError: The cluster does not fit the strategy or the hosts.
    """
    if plan.traits.single_process:
        return _single_process(plan)
    if plan.traits.launch == "ranks":
        return _horovodrun(plan)
    return _cluster(plan)


def _single_process(plan: JobPlan) -> Placement:
    task = Task("chief", 0)
    command = plan.task_argv(task.type)
    return Placement(plan, (TaskPlan(str(task), task, "localhost", None, command,
                                     env=tuple(plan.env.items())),))


def _cluster(plan: JobPlan) -> Placement:
    hosts = plan.options.hosts
    layout = dict(workers=plan.roles.get("worker", 0), ps=plan.roles.get("ps", 0),
                  chief="chief" in plan.roles, evaluator="evaluator" in plan.roles,
                  strategy=plan.strategy)
    spec = ClusterSpec.local(**layout) if hosts is None else host_cluster(hosts, **layout)
    tasks = []
    for task in spec.tasks():
        env = {**plan.env, "TF_CONFIG": spec.tf_config_json(task.type, task.index)}
        command, stdin = plan.task_argv(task.type), None
        if hosts is not None:
            command, stdin = task_command(hosts, spec.host(task), command, env)
        tasks.append(TaskPlan(
            str(task), task, spec.host(task), spec.tf_config(task.type, task.index), command,
            plan.task_kind(task.type), tuple(env.items()), max_restarts=plan.restarts(task.type),
            stdin=stdin))
    return Placement(plan, tuple(tasks), cluster=spec)


def horovodrun_path() -> str:
    """``horovodrun`` on PATH, else the one beside this Python (a venv not on PATH)."""
    beside = Path(sys.executable).parent / "horovodrun"
    return shutil.which("horovodrun") or str(beside)


def _horovodrun(plan: JobPlan) -> Placement:
    """One ``horovodrun`` process; it starts the ranks (over its own ssh on other hosts).

    Ranks get no TF_CONFIG (horovodrun passes its whole environment on). On other hosts each
    rank runs under `tfdist.launcher.remote`, so it stops when horovodrun's ssh session closes:
    horovodrun stops a rank by killing its local ssh client, which alone leaves the remote
    process running.
    """
    if plan.options.elastic:
        return _elastic_horovodrun(plan)
    hosts, count = plan.options.hosts, plan.roles["worker"]
    rank_command = plan.task_argv("worker")
    host_names = ["localhost"] * count
    host_args: tuple[str, ...] = ("-np", str(count))
    if hosts is not None:
        host_names = rank_hosts(hosts, count, plan.strategy)
        host_args += horovodrun_host_args(hosts)
        if has_remote_host(hosts):
            rank_command = (sys.executable, "-m", "tfdist.launcher.remote", "--", *rank_command)
    if plan.options.mpi:
        _check_mpirun()
    controller = "mpi" if plan.options.mpi else "gloo"
    check_controller(controller)
    return _horovodrun_placement(plan, (*host_args, f"--{controller}"), rank_command, host_names,
                                 tuple(plan.env.items()))


def _elastic_horovodrun(plan: JobPlan) -> Placement:
    """``horovodrun`` in elastic mode: each slot a host of its own (`tfdist.launcher.elastic`)."""
    options, count = plan.options, plan.roles["worker"]
    assert options.min_workers is not None and options.max_workers is not None
    check_controller("gloo")  # elastic Horovod runs on Gloo only; checked before any file exists
    hosts = slot_addresses(count)
    discovery = Discovery([f"{host}:1" for host in hosts])
    args = ("-np", str(count),
            *elastic_args(options.min_workers, options.max_workers, discovery.script), "--gloo")
    env = (*plan.env.items(), (HOSTS_FILE_ENV, discovery.hosts_file))
    return _horovodrun_placement(plan, args, plan.task_argv("worker"), hosts, env, discovery)


def _horovodrun_placement(plan: JobPlan, args: tuple[str, ...], rank_command: tuple[str, ...],
                          host_names: Sequence[str], env: tuple[tuple[str, str], ...],
                          discovery: Discovery | None = None) -> Placement:
    """The one ``horovodrun ARGS RANK_COMMAND`` task and the ranks it starts (for --dry-run);
    no TF_CONFIG for either (horovodrun passes its whole environment on to the ranks)."""
    runner = (horovodrun_path(), *args, *rank_command)
    unset = ("TF_CONFIG",)
    ranks = tuple(
        TaskPlan(f"rank:{r}", Task("worker", r), host, None, rank_command, env=env,
                 unset_env=unset)
        for r, host in enumerate(host_names)
    )
    runner_task = TaskPlan("horovodrun", None, "localhost", None, runner, env=env, unset_env=unset)
    return Placement(plan, (runner_task,), ranks=ranks, discovery=discovery)
