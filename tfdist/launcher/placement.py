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
from collections.abc import Sequence
from typing import Any

from tfdist.cluster import ClusterSpec, Task, release_ports
from tfdist.core.traits import TaskKind
from tfdist.launcher.horovodrun.command import horovodrun_command
from tfdist.launcher.horovodrun.elastic import Discovery, slot_addresses
from tfdist.launcher.hosts.layout import host_cluster, task_command
from tfdist.launcher.mesh_plan import describe_rank, tensor_hosts_warning
from tfdist.launcher.plan import JobPlan
from tfdist.parallel.mesh import TRAINING_ROLES, task_rank

__all__ = ["TaskPlan", "Placement", "place"]


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
        """Whether its processes should share a loopback-only network
        (`tfdist.launcher.local.netns`): several processes, all on this machine, and
        ``network="private"``."""
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


def _horovodrun(plan: JobPlan) -> Placement:
    """The one ``horovodrun`` task (`horovodrun_command`) and the ranks it starts (for
    ``--dry-run``); no TF_CONFIG for either (horovodrun passes its whole environment on)."""
    command = horovodrun_command(plan)
    unset = ("TF_CONFIG",)
    ranks = tuple(
        TaskPlan(f"rank:{r}", Task("worker", r), host, None, command.rank_command,
                 env=command.env, unset_env=unset)
        for r, host in enumerate(command.hosts)
    )
    runner_task = TaskPlan("horovodrun", None, "localhost", None, command.argv, env=command.env,
                           unset_env=unset)
    return Placement(plan, (runner_task,), ranks=ranks, discovery=command.discovery)
