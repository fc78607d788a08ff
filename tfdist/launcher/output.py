"""What the launcher shows of its tasks' output: a person's view by default, all with --verbose.

The default view shows, with the ``[task]`` prefix:

* the lines of the task that reports progress: the chief (``chief:0``, else ``worker:0``, or the
  job's only process) and of sidecars (the evaluator reports each checkpoint's metric); of a
  Horovod job (one ``horovodrun`` process) only rank 0's lines (``[0]<stdout>:...``);
* less TensorFlow's C++ start-up chatter, which every process prints before its own logging
  reads ``TF_CPP_MIN_LOG_LEVEL``: absl-format lines (``I0000 00:00:... port.cc:153] oneDNN ...``)
  whose severity is below that level (the launcher sets 2: INFO and WARNING hidden), the
  "All log messages before absl::InitializeLog()" banner, and the failed ``cuInit`` error of a
  task that has just said "Could not find cuda drivers" (a machine without a GPU).

Nothing is lost: every line of every task is kept in its tail (a task that fails has its last
lines printed, whatever the view), and in ``--log-dir``'s ``<task>.log``. ``--verbose`` shows
every line of every task as it comes.

Example:
    >>> view = LineView(min_level=2)
    >>> view("I0000 00:00:1795.1 18999 port.cc:153] oneDNN custom operations are on.")
    False
    >>> view("Epoch 1/8")
    True
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

__all__ = ["LineFilter", "LineView", "shown_tasks", "task_filters"]

LineFilter = Callable[[str], bool]
"""Says whether a task's output line is printed (True) or only kept in its tail and log."""

_ABSL_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [\w./-]+:\d+\] ")
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}
_ABSL_BANNER = ("WARNING: All log messages before absl::InitializeLog() is called are written "
                "to STDERR")
_NO_CUDA_DRIVER = "Could not find cuda drivers"
_CUINIT_FAILED = "failed call to cuInit"
_HOROVOD_PREFIX = re.compile(r"^[^\[]*\[(\d+)\]<(?:stdout|stderr)>:")
_DEFAULT_MIN_LEVEL = 2


class LineView:
    """The default view of one task's output: its C++ start-up chatter is dropped.

    Args:
        min_level: The task's ``TF_CPP_MIN_LOG_LEVEL``: absl-format lines of a lower severity
            (I=0, W=1, E=2, F=3) are dropped.
        first_rank_only: The task is ``horovodrun``: drop the lines of every rank but 0.

    Example:
        >>> view = LineView(min_level=2, first_rank_only=True)
        >>> view("[1]<stdout>:Epoch 1/2"), view("[0]<stdout>:Epoch 1/2")
        (False, True)
    """

    def __init__(self, min_level: int = _DEFAULT_MIN_LEVEL, first_rank_only: bool = False) -> None:
        self.min_level = min_level
        self.first_rank_only = first_rank_only
        self._no_cuda_driver = False

    def __call__(self, line: str) -> bool:
        rank = _HOROVOD_PREFIX.match(line)
        if rank is not None:
            if self.first_rank_only and rank.group(1) != "0":
                return False
            line = line[rank.end():]
        if line.strip() == _ABSL_BANNER:
            return False
        absl = _ABSL_LINE.match(line)
        if absl is None:
            return True
        if _NO_CUDA_DRIVER in line:
            self._no_cuda_driver = True
        if self._no_cuda_driver and _CUINIT_FAILED in line:
            return False  # the error that follows "no driver": expected where there is no GPU
        return _SEVERITY[absl.group(1)] >= self.min_level


def _min_level(env: Mapping[str, str]) -> int:
    value = env.get("TF_CPP_MIN_LOG_LEVEL", "")
    return int(value) if value.strip().isdigit() else 0


def shown_tasks(names: Sequence[str], kinds: Mapping[str, str]) -> set[str]:
    """The tasks whose output the default view shows: the chief and the sidecars.

    The chief is ``chief:0`` if the job has one, else ``worker:0``, else its first process (a
    single-process job, ``horovodrun``).

    Example:
        >>> sorted(shown_tasks(["chief:0", "worker:0", "ps:0", "evaluator:0"],
        ...                    {"evaluator:0": "sidecar"}))
        ['chief:0', 'evaluator:0']
    """
    chief = next((n for n in ("chief:0", "worker:0") if n in names), names[0] if names else None)
    sidecars = {name for name in names if kinds.get(name) == "sidecar"}
    return sidecars | ({chief} if chief else set())


def task_filters(
    tasks: Sequence[tuple[str, str, Mapping[str, str]]], verbose: bool, ranks: bool = False
) -> dict[str, LineFilter | None]:
    """Each task's line filter: None (every line) with ``verbose``, else its `LineView` or a
    filter that drops every line (tasks other than `shown_tasks`).

    Args:
        tasks: ``(name, kind, environment)`` of each process, in start order.
        verbose: Show everything.
        ranks: The job's one process runs ranks that prefix their lines (``horovodrun``).

    Example:
        >>> filters = task_filters([("worker:0", "main", {}), ("worker:1", "main", {})], False)
        >>> filters["worker:0"]("loss: 0.1"), filters["worker:1"]("loss: 0.1")
        (True, False)
    """
    if verbose:
        return {name: None for name, _, _ in tasks}
    shown = shown_tasks([name for name, _, _ in tasks], {name: kind for name, kind, _ in tasks})
    return {
        name: LineView(_min_level(env), first_rank_only=ranks)
        if name in shown else _hidden
        for name, _, env in tasks
    }


def _hidden(line: str) -> bool:
    return False
