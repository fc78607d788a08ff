"""The one failure policy of a job, whatever runs its tasks (local processes, ssh, Ray).

A `Supervisor` decides; a `TaskGroup` only does what it is told (start every task, poll their
exit statuses, restart one, stop all, give a task's last lines, print a line among the tasks'
output). The policy, in the order the supervisor applies it at each poll:

* A **sidecar** (an evaluator, `TaskKind` ``"sidecar"``) may fail: its failure is announced once
  (with its last lines if its output was hidden) and the job goes on. Once every main task has
  succeeded, running sidecars get ``sidecar_grace`` seconds to finish, then they are stopped.
* A **service** (a ParameterServer ``worker`` or ``ps``) serves until the main tasks are done;
  exiting before that, with any status, is a failure.
* A task with a restart budget (`Member.max_restarts`: the roles the strategy
  ``restarted_alone``) that fails is restarted alone, announced, while the job goes on.
* Any other failure ends the job: every task is stopped, and the first failing task is named with
  its last lines (with the reason when its role's loss is fatal, `StrategyTraits.fatal_roles`).

`Supervisor.run` returns the job's exit status: 0; the failed task's (a task killed by signal N:
128+N; 1 if it exited 0 too early); 124 when ``timeout`` passed; 130 on Ctrl-C; 127 when a task
could not start (the gang starts whole or not at all). SIGTERM to the launcher is a preemption
(`tfdist.resilience.preemption`): it is forwarded to every task with ``preemption_grace``
seconds to save, and the job exits `PREEMPTED_EXIT_STATUS` (75) when every training task
saved, 143 when one did not. `run_attempts` reruns the whole gang up to ``--max-restarts``
times after a failure, never after a success, a timeout, Ctrl-C or a preemption (`NOT_RESTARTED`).

Adding a runner: write one class that implements `TaskGroup` (``launch``, ``members``, ``poll``,
``restart``, ``stop``, ``tail``, ``announce``, ``poll_interval``, and a context manager whose exit
releases what one attempt holds; ``session`` if the runner must connect once for all attempts),
constructed as ``Group(plan, options)``, and name it as the ``task_group`` of the runner's record
in `tfdist.launcher.runners`; `run_job` then runs it with this policy. The local runner
(`tfdist.launcher.local.tasks.LocalTasks`, which also runs the ssh tasks of ``--hosts``) and the
Ray runner (`tfdist.launcher.ray.gang.RayGang`) are the two.

Example:
    >>> import sys
    >>> from tfdist.launcher.process import ProcessGroup
    >>> group = ProcessGroup(stream=sys.stdout)
    >>> _ = group.start("chief:0", [sys.executable, "-c", "print('hi')"])
    >>> Supervisor(timeout=30).run(group)
    [chief:0] hi
    0
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import math
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from tfdist.core.traits import TaskKind
from tfdist.errors import LaunchError, TaskFailedError, TaskTimeoutError
from tfdist.launcher import summary
from tfdist.launcher.runners import runner_named
from tfdist.launcher.signals import (
    Preempted,
    ignoring,
    raise_pending_signal,
    signals_between_polls,
    sigterm_is_preemption,
)
from tfdist.resilience.preemption import PREEMPTED_EXIT_STATUS, PREEMPTED_MARKER

if TYPE_CHECKING:
    from tfdist.launcher.plan import JobPlan

__all__ = ["Member", "TaskGroup", "Supervisor", "NOT_RESTARTED", "run_job",
           "run_attempts", "exit_status"]

SIGTERM_STATUS = 128 + signal.SIGTERM
TIMEOUT_STATUS = 124
INTERRUPTED_STATUS = 130
NOT_STARTED_STATUS = 127
# Success, timeout, interrupted by the user, preempted (saved, or not): a rerun is the user's or
# the scheduler's call.
NOT_RESTARTED = (0, TIMEOUT_STATUS, INTERRUPTED_STATUS, PREEMPTED_EXIT_STATUS, SIGTERM_STATUS)
_FAILURE_LINES = 20
_ALL_LINES = 40

OutputView = Literal["all", "filtered", "hidden"]
"""How much of a task's output is printed: every line, some (its last lines are shown when it
fails and the job goes on), or none (also shown when the job times out)."""


@dataclasses.dataclass(frozen=True)
class Member:
    """One task of a `TaskGroup`, as the policy sees it.

    Attributes:
        name: ``"worker:1"``.
        kind: ``"main"``, ``"service"`` or ``"sidecar"`` (`TaskKind`).
        max_restarts: Times it is restarted alone when it fails.
        view: How much of its output is printed (`OutputView`).
        ranks: The Horovod ranks it starts (``horovodrun``), counted instead of it; else 0.
    """

    name: str
    kind: TaskKind = "main"
    max_restarts: int = 0
    view: OutputView = "all"
    ranks: int = 0


class TaskGroup(Protocol):
    """What a runner does for the `Supervisor`: the tasks of one attempt of a job."""

    poll_interval: float
    """Seconds between polls (a poll of remote tasks costs more)."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc_info: object) -> None:
        """Stops every task and releases what the attempt holds (ports, actors, networks)."""

    def launch(self) -> None:
        """Starts every task. Raises OSError when one cannot start (`__exit__` stops the rest)."""

    def members(self) -> Sequence[Member]:
        """Its tasks (known before `launch`)."""

    def poll(self) -> Mapping[str, int | None]:
        """Each started task's exit status (None: running); passes on their new output."""

    def restart(self, name: str) -> int:
        """Starts the exited task ``name`` again, alone; its new pid."""

    def stop(self, grace: float | None = None) -> Mapping[str, int | None]:
        """SIGTERM to every task, SIGKILL after ``grace`` s (None: the group's); exit statuses."""

    def tail(self, name: str, lines: int = _FAILURE_LINES) -> str:
        """The last ``lines`` lines task ``name`` printed."""

    def stopped(self) -> Sequence[str]:
        """The running tasks whose processes are stopped (SIGSTOP, a debugger, job control)."""

    def failed_within(self, name: str) -> tuple[str, int, str] | None:
        """For a task that runs processes of its own (``horovodrun``'s ranks): the one it
        reported failed first (name, exit status, last lines); else None."""

    def announce(self, message: str) -> None:
        """Prints ``[tfdist] message`` among the tasks' output."""

    def mute(self) -> None:
        """Prints no more of the tasks' output (still kept in their tails and logs)."""

    def written(self) -> Mapping[str, str]:
        """What the tasks reported writing (`tfdist.logs.WROTE_MARKER`): path -> what."""


def log(message: str) -> None:
    """A line of the launcher's own (stderr)."""
    print(f"[tfdist-launch] {message}", file=sys.stderr, flush=True)


def exit_status(returncode: int) -> int:
    """A task killed by signal N reports -N; a shell reports 128+N."""
    return 128 - returncode if returncode < 0 else returncode


class _TaskPreempted(Exception):
    """A training task (its args) exited 75 on its own: SIGTERM reached it, not the launcher."""


@dataclasses.dataclass
class Supervisor:
    """The failure policy of one job (see the module docstring).

    Attributes:
        timeout: Seconds the job may run (None: as long as it runs).
        sidecar_grace: Seconds sidecars may run on once every main task has succeeded.
        preemption_grace: Seconds the tasks get to save and exit after SIGTERM.
        strategy: The job's strategy, for messages.
        saves_on_sigterm: Whether it can save at the step on SIGTERM (its traits).
        fatal: Role -> why its loss is fatal, or None (`JobPlan.loss_is_fatal`).
        restarts: Tasks restarted alone in the last `watch`, and how often.
        sidecar_failures: Sidecars that failed in the last `watch`, with their status.
    """

    timeout: float | None = None
    sidecar_grace: float = 0.0
    preemption_grace: float = 25.0
    fatal: Callable[[str], str | None] = lambda role: None
    strategy: str = ""
    saves_on_sigterm: bool = True
    restarts: dict[str, int] = dataclasses.field(default_factory=dict)
    sidecar_failures: dict[str, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def for_plan(cls, plan: JobPlan) -> Supervisor:
        """The policy of ``plan``: its timeout, graces and fatal roles."""
        options = plan.options
        return cls(timeout=options.timeout, sidecar_grace=options.evaluator_grace,
                   preemption_grace=options.preemption_grace, fatal=plan.loss_is_fatal,
                   strategy=plan.strategy, saves_on_sigterm=plan.traits.saves_on_sigterm)

    def run(self, group: TaskGroup) -> int:
        """Launches ``group``, supervises it to the end, stops it; the job's exit status.

        Raises:
            LaunchError: The runner could not start the job (nothing of it is left running).
        """
        started = time.monotonic()
        with group, sigterm_is_preemption():
            try:
                group.launch()
                self.watch(group)
                log(summary.done_line(group.members(), time.monotonic() - started,
                                      group.written(), self.restarts))
                return 0
            except TaskFailedError as err:
                log(self._failure_message(err) + _ended(group, started))
                return exit_status(err.returncode) or 1
            except TaskTimeoutError as err:
                log(str(err) + self._hidden_tails(group) + _ended(group, started))
                return TIMEOUT_STATUS
            except Preempted:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut it short
                log(f"received SIGTERM: forwarding it to every task; {self.preemption_grace:g} s "
                    "to save and exit")
                return self._preemption_outcome(group, group.stop(self.preemption_grace))
            except _TaskPreempted as err:  # SIGTERM reached a task, not the launcher
                log(f"{err.args[0]} exited with status {PREEMPTED_EXIT_STATUS}: it was preempted "
                    "(SIGTERM) and saved at its step; forwarding SIGTERM to every other task; "
                    f"{self.preemption_grace:g} s to save and exit")
                return self._preemption_outcome(group, group.stop(self.preemption_grace))
            except KeyboardInterrupt:
                return self._interrupted(group, started)
            except OSError as err:  # a task could not be started: the gang starts whole or not
                log(f"could not start every task ({err}); the ones already started were stopped")
                return NOT_STARTED_STATUS

    def watch(self, group: TaskGroup) -> dict[str, int | None]:
        """Waits until every main task has succeeded, gives sidecars their grace, stops the rest.

        Returns:
            Each task's exit status (tasks stopped by the group report theirs).

        Raises:
            TaskFailedError: A task failed for good; every task has been stopped.
            TaskTimeoutError: ``timeout`` passed first; every task has been stopped.
            LaunchError: The group failed (a task's output could not be kept); all stopped.
        """
        self.restarts.clear()
        self.sidecar_failures.clear()
        members = list(group.members())
        main = [m.name for m in members if m.kind == "main"]
        if not main:
            raise LaunchError("A job needs at least one main task to wait for.")
        deadline = time.monotonic() + (math.inf if self.timeout is None else self.timeout)
        try:
            with signals_between_polls():
                self._watch_main_tasks(group, members, main, deadline)
                self._wait_for_sidecars(group, members, max(0.0, deadline - time.monotonic()))
        except LaunchError:
            group.stop()
            raise
        return dict(group.stop())

    def _watch_main_tasks(self, group: TaskGroup, members: list[Member], main: list[str],
                          deadline: float) -> None:
        """Polls until every main task has succeeded (the policy above)."""
        while True:
            raise_pending_signal()
            codes = dict(group.poll())
            failed = self._first_failure(group, members, codes)
            if failed in main and codes[failed] == PREEMPTED_EXIT_STATUS:
                raise _TaskPreempted(failed)
            if failed is not None:
                task, code, tail = group.failed_within(failed) or (
                    failed, codes[failed] or 0, group.tail(failed))
                running = [n for n in main if codes.get(n) is None and n != failed]
                raise TaskFailedError(task, code, tail, stopped=tuple(group.stopped()),
                                      waited_for=summary.waited_for(tail, running))
            if all(codes.get(name) == 0 for name in main):
                return
            if time.monotonic() > deadline:
                raise TaskTimeoutError(self._timeout_message(main, codes))
            time.sleep(group.poll_interval)

    def _first_failure(self, group: TaskGroup, members: list[Member],
                       codes: dict[str, int | None]) -> str | None:
        """The task whose exit ends the job; announces sidecar failures and restarts alone those
        with a budget left."""
        main_done = all(codes.get(m.name) == 0 for m in members if m.kind == "main")
        for member in members:
            name, code = member.name, codes.get(member.name)
            if code is None or (code == 0 and member.kind != "service"):
                continue
            if member.kind == "sidecar":
                if name not in self.sidecar_failures:
                    self.sidecar_failures[name] = code
                    group.announce(f"sidecar {name} exited with status {code}; job goes on"
                                   f"{self._hidden_tail(group, member)}")
                continue
            if member.kind == "service" and main_done:
                continue
            if self.restarts.get(name, 0) < member.max_restarts:
                self._restart(group, member, code)
                codes[name] = None
                continue
            return name
        return None

    def _restart(self, group: TaskGroup, member: Member, code: int) -> None:
        count = self.restarts[member.name] = self.restarts.get(member.name, 0) + 1
        group.announce(f"{member.name} exited with status {code}; restarting it alone "
                       f"({count}/{member.max_restarts}){self._hidden_tail(group, member)}")
        group.announce(f"{member.name} restarted (pid {group.restart(member.name)})")

    def _wait_for_sidecars(self, group: TaskGroup, members: list[Member], left: float) -> None:
        """Gives running sidecars up to ``sidecar_grace`` seconds (at most ``left``) to exit."""
        grace = min(self.sidecar_grace, left)
        sidecars = [m.name for m in members if m.kind == "sidecar"]
        codes = dict(group.poll()) if sidecars else {}
        running = [name for name in sidecars if codes.get(name) is None]
        if running and grace > 0:
            group.announce(f"main tasks done; waiting up to {grace:.3g} s for sidecar(s) "
                           f"{', '.join(running)}")
            deadline = time.monotonic() + grace
            while any(codes.get(n) is None for n in running) and time.monotonic() < deadline:
                time.sleep(group.poll_interval)
                raise_pending_signal()
                codes = dict(group.poll())
            self._first_failure(group, members, codes)  # reports a sidecar that failed meanwhile
            late = [name for name in running if codes.get(name) is None]
            if late:
                group.announce(f"sidecar(s) {', '.join(late)} still running after {grace:.3g} s; "
                               "stopping them")
        elif sidecars:
            self._first_failure(group, members, codes)

    @staticmethod
    def _interrupted(group: TaskGroup, started: float) -> int:
        """Ctrl-C: the tasks' output stops at once; they get SIGTERM (a task that saves on it
        does, within the group's grace), then the line says what was stopped and saved."""
        group.mute()
        log("Ctrl-C: stopping every task (their output is no longer shown)")
        with ignoring(signal.SIGINT):  # a second Ctrl-C must not cut the (bounded) stop short
            codes = group.stop()
        main = [m.name for m in group.members() if m.kind == "main"]
        log(summary.interrupted_line(codes, time.monotonic() - started, group.written(),
                                     _saved_where(group, main).strip()))
        return INTERRUPTED_STATUS

    def _timeout_message(self, main: list[str], codes: Mapping[str, int | None]) -> str:
        running = ", ".join(name for name in main if codes.get(name) is None)
        return (f"The job did not finish within {self.timeout:g} s; still running: {running}. "
                "Every task was stopped. Fix: raise the timeout, or check these tasks' output "
                "for a hang (a wrong address in TF_CONFIG waits forever for its peers).")

    def _failure_message(self, err: TaskFailedError) -> str:
        return summary.failure_text(err, self.fatal(err.task.split(":", 1)[0]))

    @staticmethod
    def _hidden_tail(group: TaskGroup, member: Member) -> str:
        """The last lines of a task whose output is filtered, to append to a message about it."""
        if member.view == "all":
            return ""
        return f". Its last lines:\n{group.tail(member.name)}"

    @staticmethod
    def _hidden_tails(group: TaskGroup) -> str:
        """The last lines of the tasks whose output was hidden, for a timeout report."""
        return "".join(f"\nLast lines of {m.name}:\n{group.tail(m.name, 5)}"
                       for m in group.members() if m.view == "hidden")

    def _preemption_outcome(self, group: TaskGroup, codes: Mapping[str, int | None]) -> int:
        """Reports a job stopped by SIGTERM; its exit status says whether it can resume exactly."""
        main = [m.name for m in group.members() if m.kind == "main"]
        if main and all(codes.get(name) == 0 for name in main):
            log("job finished: every training task completed within the preemption grace")
            return 0
        unsaved = [name for name in main if codes.get(name) != PREEMPTED_EXIT_STATUS]
        if main and not unsaved:
            log(f"job preempted: every training task saved a checkpoint at the step it was in "
                f"and exited with status {PREEMPTED_EXIT_STATUS}. {_saved_where(group, main)}"
                "Run the same command again to resume from that step. Every task stopped.")
            return PREEMPTED_EXIT_STATUS
        statuses = ", ".join(f"{name} (exit status {codes.get(name)})" for name in unsaved)
        log(f"job stopped by SIGTERM; every task stopped. Not saved on SIGTERM: {statuses}. A "
            f"rerun resumes from the last backup, if the script makes one. {self._unsaved_fix()}")
        return SIGTERM_STATUS

    def _unsaved_fix(self) -> str:
        """How to make this job's tasks save at the step next time."""
        if not self.saves_on_sigterm:
            return (f"The {self.strategy} strategy does not save at the step on SIGTERM "
                    "(multi_worker, pipeline and tensor do); raise --preemption-grace if tasks "
                    "were SIGKILLed (exit status -9) before their own handling ended.")
        return ("Fix: give model.fit strategy.backup_callback(dir), or use "
                "strategy.preemption_handler(checkpoint, dir) in a custom loop; raise "
                "--preemption-grace if a save was cut short (SIGKILL: exit status -9).")


def _ended(group: TaskGroup, started: float) -> str:
    """A failed job's closing line: how long it ran, what it had written."""
    wrote = summary.written_text(group.written())
    return (f"\njob ended after {summary.elapsed_text(time.monotonic() - started)}"
            + (f". {wrote}" if wrote else ""))


def _saved_where(group: TaskGroup, names: list[str]) -> str:
    """Where the first training task that says so saved its checkpoint (`PREEMPTED_MARKER`)."""
    for name in names:
        for line in group.tail(name, _ALL_LINES).splitlines():
            if line.startswith(PREEMPTED_MARKER):
                return f"{name}: {line[len(PREEMPTED_MARKER):].strip()}. "
    return ""


def run_attempts(supervisor: Supervisor, max_restarts: int, first: TaskGroup,
                 again: Callable[[], TaskGroup]) -> int:
    """Runs ``first``; after a task failure, reruns the whole gang (``again()``: fresh ports, a
    fresh placement) up to ``max_restarts`` times. Scripts resume from their backup."""
    status = supervisor.run(first)
    for attempt in range(1, max_restarts + 1):
        if status in NOT_RESTARTED:
            break
        log(f"restarting the whole job ({attempt}/{max_restarts}) after exit status {status}")
        status = supervisor.run(again())
    return status


def task_group_class(runner: str) -> Any:
    """The `TaskGroup` class of the runner registered as ``runner`` (`tfdist.launcher.runners`).

    Example:
        >>> task_group_class("local").__name__
        'LocalTasks'
    """
    target = runner_named(runner).task_group
    if target is None:
        raise ValueError(f"Runner {runner!r} runs no tasks (an exporter). Fix: name a runner "
                         "with a task_group")
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def run_job(plan: JobPlan, runner: str = "local", options: Any = None,
            first: TaskGroup | None = None) -> int:
    """Runs ``plan`` with the runner registered as ``runner`` under the one policy.

    Args:
        plan: The job.
        runner: A registered runner with a ``task_group`` (`tfdist.launcher.runners`).
        options: The runner's own options (``RayOptions``; the local runner's: none).
        first: The first attempt's group, if already made (the local runner's first placement).

    Returns:
        The job's exit status (see `Supervisor.run`).
    """
    group_class = task_group_class(runner)
    session = getattr(group_class, "session", None)
    with session(options) if session else contextlib.nullcontext():
        return run_attempts(Supervisor.for_plan(plan), plan.options.max_restarts,
                            first or group_class(plan, options),
                            lambda: group_class(plan, options))
