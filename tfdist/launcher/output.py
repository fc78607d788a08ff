"""What the launcher shows of its tasks' output: a person's view by default, all with --verbose.

The default view shows, with the ``[task]`` prefix:

* the lines of the task that reports progress: the chief (``chief:0``, else ``worker:0``, or the
  job's only process) and of sidecars (the evaluator reports each checkpoint's metric); of a
  Horovod job (one ``horovodrun`` process) only rank 0's lines (``[0]<stdout>:...``);
* less the lines that name what a task wrote (`tfdist.logs.WROTE_MARKER`: the launcher's last
  line lists them) and TensorFlow's C++ start-up chatter, which every process prints before its
  own logging reads ``TF_CPP_MIN_LOG_LEVEL``: absl-format lines (``I0000 00:00:... port.cc:153]
  oneDNN ...``) whose severity is below that level (the launcher sets 2: INFO and WARNING
  hidden), the
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

import collections
import re
from collections.abc import Callable, Iterator, Mapping, Sequence

from tfdist.logs import WROTE_MARKER, parse_written

__all__ = ["LineFilter", "LineView", "RankFailure", "TaskOutput", "shown_tasks", "task_filters"]

LineFilter = Callable[[str], bool]
"""Says whether a task's output line is printed (True) or only kept in its tail and log."""

_ABSL_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [\w./-]+:\d+\] ")
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}
_ABSL_BANNER = ("WARNING: All log messages before absl::InitializeLog() is called are written "
                "to STDERR")
_NO_CUDA_DRIVER = "Could not find cuda drivers"
_CUINIT_FAILED = "failed call to cuInit"
_HOROVOD_PREFIX = re.compile(r"^[^\[]*\[(?:\d+,)?(\d+)\]<(?:stdout|stderr)>:")
"""A rank's line: Gloo tags it ``[rank]<stdout>:``, mpirun ``[job,rank]<stdout>:``."""
_RANK_TAG = re.compile(r"\[(?:\d+,)?(\d+)\]<(?:stdout|stderr)>:")
_GLOO_EXIT = re.compile(r"^Process (\d+) exit with status code (-?\d+)\.")
_MPI_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)")
_MPI_PROCESS = re.compile(r"Process name:\s+\[\[\d+,\d+\],(\d+)\]")
_MPI_EXIT_CODE = re.compile(r"^\s*Exit code:\s+(-?\d+)")
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
        >>> view("[7,1]<stdout>:Epoch 1/2"), view("[7,0]<stdout>:Epoch 1/2")  # under --mpi
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
        if line.strip() == _ABSL_BANNER or line.startswith(WROTE_MARKER):
            return False  # a marker: the launcher's last line names what was written
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


RankFailure = tuple[str, int, str]
"""A rank that ``horovodrun`` (or ``mpirun``) reported failed first: its name (``rank:N``),
its exit status and its last lines."""


class TaskOutput:
    """A task's last lines; for a task that runs Horovod ranks (``horovodrun``), also each
    rank's last lines and the first rank it reported failed, so a failure names the rank.

    Example:
        >>> out = TaskOutput(maxlen=3)
        >>> for line in ["[0]<stdout>:step 1", "[1]<stderr>:rank 1 gives up",
        ...              "[0]<stdout>:step 2", "Process 1 exit with status code 3."]:
        ...     out.append(line)
        >>> out.last(2)
        '[0]<stdout>:step 2\nProcess 1 exit with status code 3.'
        >>> out.failed_rank()
        ('rank:1', 3, 'rank 1 gives up')
        >>> mpi = TaskOutput(maxlen=9)
        >>> for line in ["[5,1]<stderr>:no data[5,0]<stdout>:waits", "  Process name: [[5,1],1]",
        ...              "  Exit code:    3"]:
        ...     mpi.append(line)
        >>> mpi.failed_rank()
        ('rank:1', 3, 'no data')
    """

    def __init__(self, maxlen: int) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=maxlen)
        self.ranks: dict[str, collections.deque[str]] = {}
        self.first_failure: tuple[str, int] | None = None
        self.written: dict[str, str] = {}
        """Path -> what it is (``model``...), from the task's `WROTE_MARKER` lines, all kept."""
        self._mpi_process: str | None = None

    def append(self, line: str) -> None:
        self.lines.append(line)
        if WROTE_MARKER in line:
            found = parse_written(_HOROVOD_PREFIX.sub("", line, count=1))
            if found is not None:
                self.written.setdefault(found[1], found[0])
        if _HOROVOD_PREFIX.match(line):
            # mpirun may put several ranks' output on one line: "[5,1]<stderr>:a[5,0]<stdout>:b"
            tags = list(_RANK_TAG.finditer(line))
            for tag, after in zip(tags, [*tags[1:], None], strict=True):
                text = line[tag.end():after.start() if after else len(line)]
                if text or len(tags) == 1:
                    self.ranks.setdefault(tag.group(1), collections.deque(
                        maxlen=self.lines.maxlen)).append(text)
        elif self.first_failure is None:
            self._read_failure(line)

    def _read_failure(self, line: str) -> None:
        """Gloo's ``Process N exit with status code C.``; mpirun's ``... process rank N ...
        exited on signal S`` and ``Process name: [[j,s],N]`` followed by ``Exit code: C``."""
        if found := _GLOO_EXIT.match(line):
            self.first_failure = (found.group(1), int(found.group(2)))
        elif found := _MPI_SIGNAL.search(line):
            self.first_failure = (found.group(1), -int(found.group(2)))
        elif found := _MPI_PROCESS.search(line):
            self._mpi_process = found.group(1)
        elif self._mpi_process is not None and (found := _MPI_EXIT_CODE.match(line)):
            self.first_failure = (self._mpi_process, int(found.group(1)))

    def __iter__(self) -> Iterator[str]:
        return iter(self.lines)

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, index: int) -> str:
        return self.lines[index]

    def last(self, lines: int) -> str:
        """The last ``lines`` lines, whoever printed them."""
        return "\n".join(list(self.lines)[-lines:])

    def failed_rank(self, lines: int = 20) -> RankFailure | None:
        """The rank reported failed first, its status and its last ``lines`` lines; None when
        no rank was reported failed."""
        if self.first_failure is None:
            return None
        rank, code = self.first_failure
        return f"rank:{rank}", code, "\n".join(list(self.ranks.get(rank, ()))[-lines:])
