"""Turn launcher options into a plan: one entry per task with its command, environment and role.

The same plan is printed by ``--dry-run`` and executed by `tfdist.launcher.local`, so what a dry run
shows is exactly what runs.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from functools import partial
from pathlib import Path
from typing import Any

from tfdist import compat
from tfdist.cluster import ClusterSpec, Task, release_ports
from tfdist.launcher.hosts import (
    HostOptions,
    has_remote_host,
    horovodrun_host_args,
    host_cluster,
    rank_hosts,
    task_command,
)
from tfdist.launcher.process import TaskKind
from tfdist.strategies.registry import SINGLE_PROCESS_STRATEGIES

STRATEGY_ENV = "TFDIST_STRATEGY"
LAUNCH_STRATEGIES = ("auto", "default", "mirrored", "multi_worker", "parameter_server", "horovod")


@dataclasses.dataclass(frozen=True)
class JobOptions:
    """What the user asked for, after parsing (see `tfdist.launcher.cli`)."""

    script: str
    script_args: tuple[str, ...] = ()
    strategy: str = "auto"
    workers: int = 2
    ps: int = 0
    chief: bool | None = None
    evaluator: bool = False
    timeout: float = 3600.0
    evaluator_grace: float = 60.0  # seconds the evaluator may run on after training is done
    hosts: HostOptions | None = None  # --hosts/--hostfile: tasks on these machines (ssh)


@dataclasses.dataclass(frozen=True)
class TaskPlan:
    """One process of a job.

    Attributes:
        name: ``"worker:1"``; for a Horovod job the single ``horovodrun`` process.
        task: The task it runs (None for the ``horovodrun`` process itself).
        host: Where it runs.
        tf_config: The TF_CONFIG object it gets, or None (Horovod ranks, single-process jobs).
        command: Its argv.
        kind: ``"main"``, ``"service"`` or ``"sidecar"`` (see `ProcessGroup`).
        env: Variables added to the launcher's environment for this process.
        unset_env: Variables of the launcher's environment this process does not get.
    """

    name: str
    task: Task | None
    host: str
    tf_config: dict[str, Any] | None
    command: tuple[str, ...]
    kind: TaskKind = "main"
    env: tuple[tuple[str, str], ...] = ()
    unset_env: tuple[str, ...] = ()

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
class JobPlan:
    """Every process of a job, plus the cluster they form (None for single-process jobs)."""

    strategy: str
    tasks: tuple[TaskPlan, ...]
    cluster: ClusterSpec | None = None
    # Horovod ranks are started by horovodrun; they are described here for --dry-run.
    ranks: tuple[TaskPlan, ...] = ()

    def describe(self) -> list[dict[str, Any]]:
        return [t.describe() for t in (self.ranks or self.tasks)]


def resolve_strategy(options: JobOptions) -> str:
    """The concrete strategy for ``auto``: ps -> parameter_server, >1 worker -> multi_worker."""
    if options.strategy != "auto":
        return options.strategy
    if options.ps > 0:
        return "parameter_server"
    if options.workers > 1:
        return "multi_worker"
    return "default"


def _python_command(options: JobOptions) -> tuple[str, ...]:
    return (sys.executable, "-u", options.script, *options.script_args)


def _base_env(strategy: str) -> dict[str, str]:
    env = {STRATEGY_ENV: strategy, "PYTHONUNBUFFERED": "1"}
    # TensorFlow's C++ INFO/WARNING lines drown the training output; set 0 to see them.
    env["TF_CPP_MIN_LOG_LEVEL"] = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")
    if compat.needs_tf_keras(strategy) and compat.LEGACY_KERAS_ENV not in os.environ:
        env[compat.LEGACY_KERAS_ENV] = "1"
    return env


def plan_job(options: JobOptions) -> JobPlan:
    """Builds the plan for a job on this machine (ports reserved now, held until released)."""
    strategy = resolve_strategy(options)
    if strategy in SINGLE_PROCESS_STRATEGIES:
        return _single_process_plan(options, strategy)
    if strategy == "horovod":
        return _horovod_plan(options)
    return _cluster_plan(options, strategy)


def _single_process_plan(options: JobOptions, strategy: str) -> JobPlan:
    env = tuple(_base_env(strategy).items())
    command = _python_command(options)
    task = TaskPlan("chief:0", Task("chief", 0), "localhost", None, command, env=env)
    return JobPlan(strategy, (task,))


def _cluster_plan(options: JobOptions, strategy: str) -> JobPlan:
    is_ps = strategy == "parameter_server"
    chief = options.chief if options.chief is not None else is_ps
    build = ClusterSpec.local if options.hosts is None else partial(host_cluster, options.hosts)
    spec = build(
        workers=options.workers, ps=options.ps, chief=chief, evaluator=options.evaluator,
        strategy=strategy,
    )
    base_env = _base_env(strategy)
    tasks = []
    for task in spec.tasks():
        tf_config = spec.tf_config(task.type, task.index)
        kind: TaskKind = "sidecar" if task.type == "evaluator" else "main"
        command = _python_command(options)
        if is_ps and task.type in ("worker", "ps"):
            kind, command = "service", (sys.executable, "-u", "-m", "tfdist.server")
        env = {**base_env, "TF_CONFIG": spec.tf_config_json(task.type, task.index)}
        if options.hosts is not None:
            command = task_command(options.hosts, spec.host(task), command, env)
        tasks.append(
            TaskPlan(str(task), task, spec.host(task), tf_config, command, kind, tuple(env.items()))
        )
    return JobPlan(strategy, tuple(tasks), cluster=spec)


def horovodrun_path() -> str:
    """``horovodrun`` on PATH, else the one beside this Python (a venv not on PATH)."""
    beside = Path(sys.executable).parent / "horovodrun"
    return shutil.which("horovodrun") or str(beside)


def _horovod_plan(options: JobOptions) -> JobPlan:
    """One ``horovodrun`` process; it starts the ranks (over its own ssh on other hosts).

    Ranks get no TF_CONFIG (horovodrun passes its whole environment on). On other hosts each
    rank runs under `tfdist.launcher.remote`, so it stops when horovodrun's ssh session closes:
    horovodrun stops a rank by killing its local ssh client, which alone leaves the remote
    process running.
    """
    env = tuple(_base_env("horovod").items())
    hosts = ["localhost"] * options.workers
    host_args: tuple[str, ...] = ("-np", str(options.workers))
    rank_command = _python_command(options)
    if options.hosts is not None:
        hosts = rank_hosts(options.hosts, options.workers)
        host_args += horovodrun_host_args(options.hosts)
        if has_remote_host(options.hosts):
            rank_command = (sys.executable, "-m", "tfdist.launcher.remote", "--", *rank_command)
    runner = (horovodrun_path(), *host_args, "--gloo", *rank_command)
    unset = ("TF_CONFIG",)
    ranks = tuple(
        TaskPlan(f"rank:{r}", Task("worker", r), host, None, rank_command, env=env,
                 unset_env=unset)
        for r, host in enumerate(hosts)
    )
    runner_task = TaskPlan("horovodrun", None, "localhost", None, runner, env=env, unset_env=unset)
    return JobPlan("horovod", (runner_task,), ranks=ranks)


def release_plan(plan: JobPlan) -> None:
    """Releases the ports ``plan`` holds (after its job ended, or when it will not run)."""
    if plan.cluster is not None:
        release_ports(plan.cluster.ports())
