"""The launcher's closing lines: how long the job ran, what ran, what it wrote.

Pure functions of what the `Supervisor` knows at the end: the tasks (`Member`, a ``horovodrun``
task counts its ranks), their exit statuses, the seconds since the launch, and what the tasks
said they wrote (`tfdist.logs.WROTE_MARKER` lines: path -> what).

Example:
    >>> from tfdist.launcher.supervisor import Member
    >>> elapsed_text(75.2)
    '1 min 15 s'
    >>> done_line([Member("horovodrun", ranks=2)], 12.34, {"/r/m.keras": "model"})
    'job finished in 12.3 s: 2 Horovod ranks succeeded. Wrote: model /r/m.keras'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from tfdist.errors import STEP_DEADLINE_MARKER

if TYPE_CHECKING:
    from tfdist.errors import TaskFailedError
    from tfdist.launcher.supervisor import Member

__all__ = ["elapsed_text", "processes_text", "written_text", "done_line", "interrupted_line",
           "waited_for", "failure_text"]

_ORDER = ("model", "checkpoints", "backups", "TensorBoard")


def elapsed_text(seconds: float) -> str:
    """``12.3 s``, ``1 min 15 s`` or ``2 h 05 min``.

    Example:
        >>> elapsed_text(9.96), elapsed_text(7500)
        ('10.0 s', '2 h 05 min')
    """
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def processes_text(members: Sequence[Member]) -> str:
    """``2 tasks``, or the ranks a ``horovodrun`` task started (``2 Horovod ranks``).

    Example:
        >>> from tfdist.launcher.supervisor import Member
        >>> processes_text([Member("worker:0"), Member("worker:1")])
        '2 tasks'
    """
    ranks = sum(member.ranks for member in members)
    tasks = sum(1 for member in members if not member.ranks)
    parts = [f"{ranks} Horovod rank{'s' * (ranks != 1)}"] if ranks else []
    if tasks or not ranks:
        parts.append(f"{tasks} task{'s' * (tasks != 1)}")
    return " and ".join(parts)


def written_text(written: Mapping[str, str]) -> str:
    """``Wrote: model /r/m.keras; backups /r/backup``, or nothing when nothing was reported.

    Example:
        >>> written_text({"/r/b": "backups", "/r/m.keras": "model"})
        'Wrote: model /r/m.keras; backups /r/b'
        >>> written_text({})
        ''
    """
    rank = {what: index for index, what in enumerate(_ORDER)}
    items = sorted(written.items(), key=lambda item: (rank.get(item[1], len(_ORDER)), item[0]))
    return "Wrote: " + "; ".join(f"{what} {path}" for path, what in items) if items else ""


def done_line(members: Sequence[Member], seconds: float, written: Mapping[str, str],
              restarts: Mapping[str, int] | None = None) -> str:
    """The line of a job whose main tasks all succeeded."""
    line = f"job finished in {elapsed_text(seconds)}: {processes_text(members)} succeeded"
    if restarts:
        line += f"; restarted alone: {dict(restarts)}"
    wrote = written_text(written)
    return f"{line}. {wrote}" if wrote else line


def interrupted_line(codes: Mapping[str, int | None], seconds: float,
                     written: Mapping[str, str], saved: str = "") -> str:
    """The line after Ctrl-C: which tasks were stopped (their exit statuses), what was saved.

    Args:
        codes: Each task's exit status once stopped.
        seconds: Since the launch.
        written: What the tasks reported writing before they were stopped.
        saved: Where a task said it saved a checkpoint on the SIGTERM it was sent, if one did.

    Example:
        >>> interrupted_line({"worker:0": -15, "worker:1": -15}, 3.0, {})
        'interrupted (Ctrl-C) after 3.0 s: stopped worker:0 (exit status -15), worker:1 (exit status -15). Nothing was reported saved.'
    """  # noqa: E501
    stopped = ", ".join(f"{name} (exit status {code})" for name, code in codes.items())
    line = f"interrupted (Ctrl-C) after {elapsed_text(seconds)}: stopped {stopped}."
    kept = " ".join(part for part in (saved, written_text(written)) if part)
    return f"{line} {kept or 'Nothing was reported saved.'}"


def waited_for(tail: str, running: Sequence[str]) -> tuple[str, ...]:
    """The tasks a failed task waited for: those still ``running`` when it failed at its step
    deadline (its ``tail`` holds the watchdog's line), else none.

    Example:
        >>> waited_for(STEP_DEADLINE_MARKER + " of 30 s ...", ["worker:1"])
        ('worker:1',)
        >>> waited_for("Traceback ... ValueError", ["worker:1"])
        ()
    """
    return tuple(running) if STEP_DEADLINE_MARKER in tail else ()


def failure_text(err: TaskFailedError, fatal_reason: str | None) -> str:
    """What the launcher says of the task that ended the job: the one whose loss is fatal, a
    stopped or stuck task its peers waited for, else the first to fail."""
    task, status, tail = err.task, err.returncode, err.output_tail
    if fatal_reason:
        return (f"{task} died: {fatal_reason}. Restart the job (--max-restarts N reruns it; with "
                "BackupAndRestore in the script, training resumes from the last backup). Exit "
                f"status {status}; every task stopped. Its last lines:\n{tail}")
    if err.stopped:
        return (f"task {', '.join(err.stopped)} stopped making progress (its process was "
                f"stopped: SIGSTOP, a debugger or job control), and task {task} failed waiting "
                f"for it (exit status {status}); every task stopped. Last lines of {task}:\n{tail}")
    if err.waited_for:
        return (f"task {', '.join(err.waited_for)} did not join the step that task {task} "
                "waited for (still running when it failed: stuck, or far slower; look at its "
                f"output, or dump its stack with py-spy), and task {task} failed at its step "
                f"deadline (exit status {status}); every task stopped. Last lines of "
                f"{task}:\n{tail}")
    return (f"task {task} failed first (exit status {status}); every task stopped. Its last "
            f"lines:\n{tail}")
