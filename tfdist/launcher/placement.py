"""Where a planned job runs: `place` lays a `JobPlan` out as processes on this machine or its hosts.

`tfdist.launcher.plan` decides the job; this module only lays it out: ports reserved, one
TF_CONFIG and argv per task, or the one ``horovodrun`` (``mpirun`` under ``--mpi``, elastic with
``--min-workers``) process that starts Horovod's ranks. ``--dry-run`` prints the very placement
that runs, and each gang restart places the same plan again on fresh ports.

Example:
    >>> from tfdist.launcher.options import JobOptions
    >>> from tfdist.launcher.plan import plan_job
    >>> placement = place(plan_job(JobOptions("train.py", workers=2)))
    >>> [task.name for task in placement.tasks]
    ['worker:0', 'worker:1']
    >>> placement.release()
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tfdist.cluster import ClusterSpec, Task, release_ports
from tfdist.core.traits import TaskKind
from tfdist.errors import StrategyConfigError
from tfdist.horovod.checks import check_controller
from tfdist.launcher.elastic import HOSTS_FILE_ENV, Discovery, elastic_args, slot_addresses
from tfdist.launcher.hosts import (
    has_remote_host,
    horovodrun_host_args,
    host_cluster,
    rank_hosts,
    task_command,
)
from tfdist.launcher.mesh_plan import describe_rank, tensor_hosts_warning
from tfdist.launcher.plan import JobPlan
from tfdist.parallel.mesh import TRAINING_ROLES, task_rank

__all__ = ["TaskPlan", "Placement", "place", "horovodrun_path"]


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
    ``warnings``: what the launcher should say before it starts (a tensor group split over
    hosts).
    """

    plan: JobPlan
    tasks: tuple[TaskPlan, ...]
    cluster: ClusterSpec | None = None
    ranks: tuple[TaskPlan, ...] = ()
    discovery: Discovery | None = None
    warnings: tuple[str, ...] = ()

    def describe(self) -> list[dict[str, Any]]:
        """One JSON object per task; with a mesh (`JobPlan.mesh`), each training task's
        ``mesh``: its rank, coordinates and groups."""
        lines = [self._with_mesh(t, t.describe()) for t in (self.ranks or self.tasks)]
        if self.discovery is not None:
            options = self.plan.options
            elastic = {"min_workers": options.min_workers, "max_workers": options.max_workers,
                       "hosts_file": self.discovery.hosts_file,
                       "slots": list(self.loopback_addresses)}
            lines.append({**self.tasks[0].describe(), "elastic": elastic})
        return lines

    def _with_mesh(self, task: TaskPlan, line: dict[str, Any]) -> dict[str, Any]:
        mesh = self.plan.mesh
        if mesh is None or task.task is None or task.task.type not in TRAINING_ROLES:
            return line
        rank = task_rank(task.task.type, task.task.index, self.plan.roles.get("chief", 0))
        return {**line, "mesh": describe_rank(mesh, rank)}

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
                                     env=tuple(plan.env.items()), unset_env=("TF_CONFIG",)),))


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
    return Placement(plan, tuple(tasks), cluster=spec, warnings=_mesh_warnings(plan, tasks))


def _mesh_warnings(plan: JobPlan, tasks: Sequence[TaskPlan]) -> tuple[str, ...]:
    """A tensor group whose processes the hosts split (`tensor_hosts_warning`)."""
    if plan.mesh is None or plan.options.hosts is None:
        return ()
    chiefs = plan.roles.get("chief", 0)
    by_rank = {task_rank(t.task.type, t.task.index, chiefs): t.host for t in tasks
               if t.task is not None and t.task.type in TRAINING_ROLES}
    hosts = [by_rank[rank] for rank in sorted(by_rank)]
    warning = tensor_hosts_warning(plan.mesh, hosts)
    return () if warning is None else (warning,)


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


def _check_mpirun() -> None:
    """``horovodrun --mpi`` starts ranks with OpenMPI's mpirun (not needed to export a job)."""
    if shutil.which("mpirun") is None:
        raise StrategyConfigError(
            "--mpi needs OpenMPI's mpirun, which is not on PATH. Fix: apt-get install "
            "openmpi-bin libopenmpi-dev, then bash launch/setup.sh (Horovod is rebuilt with "
            "MPI), or drop --mpi to use Gloo")
