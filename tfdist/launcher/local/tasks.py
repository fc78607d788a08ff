"""Run a `JobPlan` on this machine: gang start, prefixed output, stop everything on failure.

The fault policy comes from the strategy's traits: a task whose role is ``restarted_alone`` (a
ParameterServer ``worker``) is restarted alone (same TF_CONFIG, same port) up to
``--max-worker-restarts`` times while the job carries on; losing a task whose role is in
``fatal_roles`` (a ``ps``: its variables are gone) stops the job with that reason. An evaluator is
a sidecar: its crash is reported and training goes on; once the training tasks are done it gets up
to ``--evaluator-grace`` seconds to evaluate the last checkpoint and exit, then it is stopped.

SIGTERM to the launcher is a preemption (`tfdist.resilience.preemption`): every task gets
SIGTERM and up to ``--preemption-grace`` seconds to save at its current step; the launcher
exits with `PREEMPTED_EXIT_STATUS` when every training task did, else with 143, and never
restarts the job.

The policy is `tfdist.launcher.supervisor.Supervisor`'s, the same for every runner; this module
is the local runner's `TaskGroup`, `LocalTasks`: one `ProcessGroup` for a `Placement`'s processes
(tasks on other hosts of ``--hosts`` are local ``ssh`` processes), its ports, its private network.
"""

from __future__ import annotations

import json

from tfdist.errors import LaunchError
from tfdist.launcher import supervisor
from tfdist.launcher.local.netns import NetworkIsolationError, PrivateNetwork
from tfdist.launcher.output import LineFilter, shown_tasks, task_filters
from tfdist.launcher.placement import Placement, TaskPlan, place
from tfdist.launcher.plan import JobPlan
from tfdist.launcher.process import ProcessGroup
from tfdist.launcher.supervisor import Member, Supervisor, log

__all__ = ["LocalTasks", "run_job", "run_placement"]


class LocalTasks(ProcessGroup):
    """The local runner's `TaskGroup`: the processes of one `Placement` (one attempt).

    Example:
        >>> from tfdist.launcher.plan import JobOptions, plan_job
        >>> tasks = LocalTasks(plan_job(JobOptions("train.py", workers=2)))
        >>> [(m.name, m.kind) for m in tasks.members()]
        [('worker:0', 'main'), ('worker:1', 'main')]
        >>> tasks.placement.release()
    """

    def __init__(self, plan: JobPlan, placement: Placement | None = None) -> None:
        """Places ``plan`` (free ports now), unless its ``placement`` is given."""
        self.placement = placement or place(plan)
        self.network: PrivateNetwork | None = None
        super().__init__(log_dir=plan.options.log_dir, sidecar_grace=plan.options.evaluator_grace,
                         join_network=self._join_network)

    def _join_network(self) -> None:  # pragma: no cover - runs in the child before exec
        if self.network is not None:
            self.network.join()

    def members(self) -> list[Member]:
        verbose = self.placement.plan.options.verbose
        tasks = self.placement.tasks
        shown = shown_tasks([t.name for t in tasks], {t.name: t.kind for t in tasks})
        ranks = len(self.placement.ranks)  # a Horovod job's one task, horovodrun, starts them
        return [Member(t.name, t.kind, t.max_restarts,
                       "all" if verbose else "filtered" if t.name in shown else "hidden",
                       ranks=ranks if t.name == "horovodrun" else 0)
                for t in tasks]

    def launch(self) -> None:
        """Starts every task of the placement, in its private network where it has one."""
        filters = _output_filters(self.placement)
        self.network = _private_network(self.placement)
        for task in self.placement.tasks:
            started = self.start(task.name, task.command, env=task.environ(), kind=task.kind,
                                 max_restarts=task.max_restarts, stdin=task.stdin,
                                 show=filters[task.name])
            log(f"started {task.name} (pid {started.pid}){_where(self.placement, task)}")

    def __exit__(self, *exc_info: object) -> None:
        try:
            super().__exit__(*exc_info)
        finally:
            self.placement.release()
            if self.network is not None:
                self.network.close()


def run_placement(placement: Placement) -> int:
    """Starts every task of ``placement`` and waits for the job; releases its ports after.

    Returns:
        0 on success, else the exit status of the first task that failed (124 on timeout).
    """
    return Supervisor.for_plan(placement.plan).run(LocalTasks(placement.plan, placement))


def run_job(plan: JobPlan, placement: Placement | None = None) -> int:
    """Runs ``plan``; after a task failure, restarts the whole gang up to ``max_restarts`` times.

    Each restart places the plan again (new free ports): a half-dead job cannot train, and the
    old ports may still be in TIME_WAIT. Scripts resume from their ``BackupAndRestore`` backup.
    Tasks the strategy restarts alone are first restarted alone (`TaskPlan.max_restarts`).

    Args:
        plan: The job.
        placement: Its first placement, if already made (``--dry-run`` and the CLI place first).
    """
    return supervisor.run_job(plan, "local", first=LocalTasks(plan, placement))


def _output_filters(placement: Placement) -> dict[str, LineFilter | None]:
    """Which lines of each task are printed (`tfdist.launcher.output`); says what is hidden."""
    verbose = placement.plan.options.verbose
    if verbose:
        for line in placement.describe():
            log(f"task {json.dumps(line)}")
    tasks = [(t.name, t.kind, t.environ()) for t in placement.tasks]
    hidden = [t.name for t in placement.tasks if t.name not in shown_tasks(
        [t.name for t in placement.tasks], {t.name: t.kind for t in placement.tasks})]
    if not verbose and (hidden or placement.ranks):
        others = ", ".join(hidden) if hidden else "ranks other than 0"
        keep = "" if placement.plan.options.log_dir else "; --log-dir DIR keeps every task's log"
        log(f"output of {others} hidden unless it fails (--verbose shows it{keep})")
    return task_filters(tasks, verbose, ranks=bool(placement.ranks))


def _where(placement: Placement, task: TaskPlan) -> str:
    """`` at host:port``, the task's address in its cluster, else nothing (one process)."""
    if placement.cluster is None or task.task is None:
        return ""
    return f" at {placement.cluster.address(task.task)}"


def _private_network(placement: Placement) -> PrivateNetwork | None:
    """A loopback-only network for the placement's tasks, where it applies and is allowed."""
    if not placement.private_network:
        return None
    try:
        network = PrivateNetwork(placement.loopback_addresses).start()
    except NetworkIsolationError as err:
        if placement.loopback_addresses:  # an elastic job's slots exist only in the namespace
            raise LaunchError(f"{err}. An elastic job (--min-workers/--max-workers) names each "
                              "slot by a loopback address of its private network. Fix: run "
                              "tfdist-launch as root (CAP_SYS_ADMIN)") from err
        log(f"warning: {err}. The job runs on this machine's network: its TF servers listen on "
             "every interface, unauthenticated. Run as root (CAP_SYS_ADMIN) to isolate it, or "
             "pass --network host to accept this and silence the warning")
        return None
    log("tasks share a private network with only loopback (--network host to opt out)")
    if placement.discovery is not None:
        log(f"elastic: slots {', '.join(placement.loopback_addresses)}; the ranks' hosts are "
             f"listed in {placement.discovery.hosts_file} (edit it to remove or add slots)")
    return network


