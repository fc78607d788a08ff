"""Exceptions raised by tfdist.

Every error caused by user input subclasses ``ValueError`` or ``TypeError`` and carries a message
in three parts: what was received, what was expected, and how to fix it.
"""

from __future__ import annotations

__all__ = [
    "TfdistError",
    "ClusterConfigError",
    "StrategyConfigError",
    "KerasCompatibilityError",
    "LaunchError",
    "TaskFailedError",
    "TaskTimeoutError",
    "EvaluatorTimeoutError",
    "MissingDependencyError",
    "AdviseError",
    "STEP_DEADLINE_MARKER",
    "format_error",
]

STEP_DEADLINE_MARKER = "tfdist: a batch ran past its deadline"
"""How a process's step watchdog (`tfdist.watchdog`) starts its message: the launcher reads it in
a failed task's last lines to name the peers it waited for."""


def format_error(problem: str, *, received: object, expected: str, fix: str) -> str:
    """Builds the standard three-part message.

    Example:
        >>> format_error("Invalid port.", received="h:99999", expected="1..65535", fix="Use 2222.")
        'Invalid port. Received: h:99999. Expected: 1..65535. Fix: Use 2222.'
    """
    return f"{problem} Received: {received}. Expected: {expected}. Fix: {fix}"


class TfdistError(Exception):
    """Base class of every tfdist error."""


class ClusterConfigError(TfdistError, ValueError):
    """A cluster spec or TF_CONFIG is invalid. Raised before any process starts."""


class StrategyConfigError(TfdistError, ValueError):
    """A strategy was asked for with options or an environment that cannot work."""


class KerasCompatibilityError(TfdistError, ValueError):
    """The Keras in use cannot train with the chosen strategy (e.g. Keras 3 + ParameterServer)."""


class MissingDependencyError(TfdistError, ImportError):
    """An optional dependency (such as Horovod) is not installed."""


class AdviseError(TfdistError, ValueError):
    """The advisor cannot predict: a model that does not build, a cluster no layout fits, a
    network probe that cannot run or reach a host."""


class LaunchError(TfdistError, RuntimeError):
    """A job could not be started, or one of its tasks failed."""


class TaskFailedError(LaunchError):
    """A task of a job exited with a non-zero status.

    Attributes:
        task: The failing task, as ``"type:index"`` (e.g. ``"worker:1"``).
        returncode: Its exit status (negative: killed by that signal).
        output_tail: Its last lines of output.
        stopped: Tasks whose processes were stopped (SIGSTOP, a debugger, job control) when it
            failed: their peers time out waiting for them, so they are the likely cause.
        waited_for: Tasks still running when it failed at its step deadline
            (`STEP_DEADLINE_MARKER` in its last lines): the peers it waited for.
    """

    def __init__(self, task: str, returncode: int, output_tail: str = "",
                 stopped: tuple[str, ...] = (), waited_for: tuple[str, ...] = ()) -> None:
        self.task = task
        self.returncode = returncode
        self.output_tail = output_tail
        self.stopped = stopped
        self.waited_for = waited_for
        message = f"Task {task} failed with exit status {returncode}."
        if stopped:
            message = (f"Task(s) {', '.join(stopped)} stopped making progress (process "
                       f"stopped); task {task} failed with exit status {returncode}.")
        elif waited_for:
            message = (f"Task(s) {', '.join(waited_for)} did not join the step (alive: stuck?); "
                       f"task {task} failed at its step deadline with exit status {returncode}.")
        if output_tail:
            message += f" Its last output lines:\n{output_tail}"
        super().__init__(message)


class TaskTimeoutError(LaunchError):
    """A job did not finish within its timeout; every task was stopped."""


class EvaluatorTimeoutError(TfdistError, TimeoutError):
    """A sidecar evaluator saw no checkpoint appear within its timeout."""
