"""Run a `JobPlan` on this machine: gang start, prefixed output, stop everything on failure.

The fault policy comes from the strategy's traits: a task whose role is ``restarted_alone`` (a
ParameterServer ``worker``) is restarted alone (same TF_CONFIG, same port) up to
``--max-worker-restarts`` times while the job carries on; losing a task whose role is in
``fatal_roles`` (a ``ps``: its variables are gone) stops the job with that reason. An evaluator is
a sidecar: its crash is reported and training goes on; once the training tasks are done it gets up
to ``--evaluator-grace`` seconds to evaluate the last checkpoint and exit, then it is stopped.

SIGTERM to the launcher is a preemption (`tfdist.preemption`): every task gets SIGTERM and up to
``--preemption-grace`` seconds to save at its current step; the launcher exits with
`PREEMPTED_EXIT_STATUS` when every training task did, else with 143, and never restarts the job.
"""

from __future__ import annotations

import json
import signal
import sys
from types import FrameType

from tfdist.errors import LaunchError, TaskFailedError, TaskTimeoutError
from tfdist.launcher.netns import NetworkIsolationError, PrivateNetwork
from tfdist.launcher.output import LineFilter, shown_tasks, task_filters
from tfdist.launcher.placement import Placement, TaskPlan, place
from tfdist.launcher.plan import JobPlan
from tfdist.launcher.process import ProcessGroup, TaskProcess
from tfdist.preemption import PREEMPTED_EXIT_STATUS, PREEMPTED_MARKER

_SIGTERM_STATUS = 128 + signal.SIGTERM


class _Preempted(Exception):
    """The launcher received SIGTERM."""


def _log(message: str) -> None:
    print(f"[tfdist-launch] {message}", file=sys.stderr, flush=True)


def exit_status(returncode: int) -> int:
    """A task killed by signal N reports -N; a shell reports 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def failure_message(plan: JobPlan, err: TaskFailedError) -> str:
    reason = plan.loss_is_fatal(err.task.split(":", 1)[0])
    if reason:
        return (
            f"{err.task} died: {reason}. Restart the job (--max-restarts N reruns it; with "
            f"BackupAndRestore in the script, training resumes from the last backup). Exit status "
            f"{err.returncode}; every task stopped. Its last lines:\n{err.output_tail}"
        )
    return (f"task {err.task} failed first (exit status {err.returncode}); every task stopped. "
            f"Its last lines:\n{err.output_tail}")


def run_placement(placement: Placement) -> int:
    """Starts every task of ``placement`` and waits for the job; releases its ports after.

    Returns:
        0 on success, else the exit status of the first task that failed (124 on timeout).
    """
    plan = placement.plan
    filters = _output_filters(placement)
    try:
        network = _private_network(placement)
    except LaunchError:
        placement.release()
        raise
    group = ProcessGroup(log_dir=plan.options.log_dir, sidecar_grace=plan.options.evaluator_grace,
                         join_network=network.join if network else None)
    previous = signal.signal(signal.SIGTERM, _raise_preempted)
    try:
        for task in placement.tasks:
            started = group.start(task.name, task.command, env=task.environ(), kind=task.kind,
                                  max_restarts=task.max_restarts, stdin=task.stdin,
                                  show=filters[task.name])
            _log(f"started {task.name} (pid {started.pid}){_where(placement, task)}")
        group.wait(timeout=plan.options.timeout)
        restarted = {t.name: t.restarts for t in group.tasks.values() if t.restarts}
        _log(f"job finished: {len(placement.tasks)} task(s) succeeded"
             + (f"; restarted alone: {restarted}" if restarted else ""))
        return 0
    except TaskFailedError as err:
        _log(failure_message(plan, err))
        return exit_status(err.returncode) or 1
    except TaskTimeoutError as err:
        _log(str(err) + _hidden_tails(group, placement))
        return 124
    except _Preempted:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut this short
        grace = plan.options.preemption_grace
        _log(f"received SIGTERM: forwarding it to every task; {grace:g} s to save and exit")
        group.stop(grace_period=grace)
        return _preemption_outcome(group)
    except KeyboardInterrupt:
        _log("interrupted; stopping every task")
        return 130
    except OSError as err:  # a task could not be started: the gang starts whole or not at all
        _log(f"could not start every task ({err}); the ones already started were stopped")
        return 127
    finally:
        group.stop()
        signal.signal(signal.SIGTERM, previous)
        placement.release()
        if network:
            network.close()


def _output_filters(placement: Placement) -> dict[str, LineFilter | None]:
    """Which lines of each task are printed (`tfdist.launcher.output`); says what is hidden."""
    verbose = placement.plan.options.verbose
    if verbose:
        for line in placement.describe():
            _log(f"task {json.dumps(line)}")
    tasks = [(t.name, t.kind, t.environ()) for t in placement.tasks]
    hidden = [t.name for t in placement.tasks if t.name not in shown_tasks(
        [t.name for t in placement.tasks], {t.name: t.kind for t in placement.tasks})]
    if not verbose and (hidden or placement.ranks):
        others = ", ".join(hidden) if hidden else "ranks other than 0"
        keep = "" if placement.plan.options.log_dir else "; --log-dir DIR keeps every task's log"
        _log(f"output of {others} hidden unless it fails (--verbose shows it{keep})")
    return task_filters(tasks, verbose, ranks=bool(placement.ranks))


def _where(placement: Placement, task: TaskPlan) -> str:
    """`` at host:port``, the task's address in its cluster, else nothing (one process)."""
    if placement.cluster is None or task.task is None:
        return ""
    return f" at {placement.cluster.address(task.task)}"


def _hidden_tails(group: ProcessGroup, placement: Placement) -> str:
    """The last lines of the tasks whose output was hidden, for a timeout report."""
    if placement.plan.options.verbose:
        return ""
    shown = shown_tasks(list(group.tasks), {n: t.kind for n, t in group.tasks.items()})
    return "".join(f"\nLast lines of {name}:\n{task.output_tail(5)}"
                   for name, task in group.tasks.items() if name not in shown)


def _preemption_outcome(group: ProcessGroup) -> int:
    """Reports a job stopped by SIGTERM; its exit status says whether it can resume exactly."""
    main = [t for t in group.tasks.values() if t.kind == "main"]
    if all(t.popen.returncode == 0 for t in main):
        _log("job finished: every training task completed within the preemption grace")
        return 0
    unsaved = [t for t in main if t.popen.returncode != PREEMPTED_EXIT_STATUS]
    if not unsaved:
        _log(f"job preempted: every training task saved a checkpoint at the step it was in and "
             f"exited with status {PREEMPTED_EXIT_STATUS}. {_saved_where(main)}Run the same "
             f"command again to resume from that step. Every task stopped.")
        return PREEMPTED_EXIT_STATUS
    statuses = ", ".join(f"{t.name} (exit status {t.popen.returncode})" for t in unsaved)
    _log(f"job stopped by SIGTERM; every task stopped. Not saved on SIGTERM: {statuses}. A rerun "
         f"resumes from the last backup, if the script makes one. Fix: give model.fit "
         f"strategy.backup_callback(dir) (multi_worker, tf-keras), or use "
         f"strategy.preemption_handler(checkpoint, dir) in a custom loop; raise "
         f"--preemption-grace if a save was cut short (SIGKILL: exit status -9).")
    return _SIGTERM_STATUS


def _saved_where(tasks: list[TaskProcess]) -> str:
    for task in tasks:
        for line in task.tail:
            if line.startswith(PREEMPTED_MARKER):
                return f"{task.name}: {line[len(PREEMPTED_MARKER):].strip()}. "
    return ""


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
        _log(f"warning: {err}. The job runs on this machine's network: its TF servers listen on "
             "every interface, unauthenticated. Run as root (CAP_SYS_ADMIN) to isolate it, or "
             "pass --network host to accept this and silence the warning")
        return None
    _log("tasks share a private network with only loopback (--network host to opt out)")
    if placement.discovery is not None:
        _log(f"elastic: slots {', '.join(placement.loopback_addresses)}; the ranks' hosts are "
             f"listed in {placement.discovery.hosts_file} (edit it to remove or add slots)")
    return network


# Success, timeout, interrupted by the user, preempted (saved, or not): a rerun is the user's or
# the scheduler's call.
NOT_RESTARTED = (0, 124, 130, PREEMPTED_EXIT_STATUS, _SIGTERM_STATUS)


def run_job(plan: JobPlan, placement: Placement | None = None) -> int:
    """Runs ``plan``; after a task failure, restarts the whole gang up to ``max_restarts`` times.

    Each restart places the plan again (new free ports): a half-dead job cannot train, and the
    old ports may still be in TIME_WAIT. Scripts resume from their ``BackupAndRestore`` backup.
    Tasks the strategy restarts alone are first restarted alone (`TaskPlan.max_restarts`).

    Args:
        plan: The job.
        placement: Its first placement, if already made (``--dry-run`` and the CLI place first).
    """
    status = run_placement(placement or place(plan))
    max_restarts = plan.options.max_restarts
    for attempt in range(1, max_restarts + 1):
        if status in NOT_RESTARTED:
            break
        _log(f"restarting the whole job ({attempt}/{max_restarts}) after exit status {status}")
        status = run_placement(place(plan))
    return status


def _raise_preempted(signum: int, frame: FrameType | None) -> None:
    raise _Preempted
