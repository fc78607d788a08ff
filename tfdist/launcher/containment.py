"""Keep every process a job's tasks start inside the job, and end all of them with it.

A task can start processes that leave its process group (``setsid``, ``start_new_session=True``,
a daemon's double fork): signalling the task's process group misses them, and
``PR_SET_PDEATHSIG`` takes down only the task itself when the launcher is SIGKILLed. So each task
of a local job runs in a cgroup (v2) of its own, under one cgroup of the job. Nothing a task
starts can leave its cgroup however it detaches (only a write to a cgroup file moves a process),
and ``cgroup.kill`` makes the kernel SIGKILL every process in it (Linux 5.14+; older kernels get a
SIGKILL per listed process until none is left).

A guardian process (``python -m tfdist.launcher.containment PATH``), in a session of its own and
outside the job's cgroup, reads a pipe from the launcher. When the launcher closes it, exits or
dies (SIGKILL included), the guardian sees end of file, kills the job's cgroup and each task's
process group, removes the cgroup and exits. So no process of the job outlives its launcher.

Where no cgroup v2 hierarchy is writable (not root, cgroup v1 only), the job runs without cgroups
and the guardian kills each task's process group: ordinary children of a task still end with the
launcher, but a process that left its task's group (``setsid``) can outlive it.

Example:
    >>> import subprocess, sys
    >>> job = Containment().start()
    >>> task = subprocess.Popen([sys.executable, "-c", "pass"],
    ...                         preexec_fn=job.joiner("worker:0"))
    >>> job.watch_group("worker:0", task.pid)
    >>> task.wait()
    0
    >>> job.kill()
    []
    >>> job.close()
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["Containment", "cgroup2_directory"]

_KILL_TIMEOUT = 10.0
_POLL_SECONDS = 0.02
_CLOSE_TIMEOUT = 15.0
_CLOSED = "closed"
_names = itertools.count()


def cgroup2_directory() -> Path | None:
    """The directory of this process's cgroup in the cgroup v2 hierarchy, or None without one.

    Example:
        >>> path = cgroup2_directory()
        >>> path is None or path.is_dir()
        True
    """
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        groups = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    mount = next((fields[4] for fields in map(str.split, mounts)
                  if "-" in fields and fields[fields.index("-") + 1] == "cgroup2"), None)
    own = next((line[3:] for line in groups if line.startswith("0::")), None)
    if mount is None or own is None:
        return None
    path = Path(mount) / own.lstrip("/")
    return path if path.is_dir() else None


def _task_directory(job: Path, task: str) -> Path:
    return job / task.replace(":", "_").replace("/", "_")


def _members(path: Path) -> list[int]:
    """Every process in cgroup ``path`` and the cgroups below it."""
    pids: list[int] = []
    for procs in path.rglob("cgroup.procs"):
        try:
            pids += [int(p) for p in procs.read_text().split()]
        except (OSError, ValueError):
            continue
    return pids


def kill_cgroup(path: Path, timeout: float = _KILL_TIMEOUT) -> list[int]:
    """SIGKILLs every process in cgroup ``path`` (and below) and waits until they are gone.

    Returns:
        The processes still there after ``timeout`` seconds (``[]``: none).
    """
    try:
        (path / "cgroup.kill").write_text("1")
        killed_by_kernel = True
    except OSError:  # before Linux 5.14, or already removed
        killed_by_kernel = False
    deadline = time.monotonic() + timeout
    while (left := _members(path)) and time.monotonic() < deadline:
        if not killed_by_kernel:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        time.sleep(_POLL_SECONDS)
    return left


def remove_cgroup(path: Path) -> None:
    """Removes cgroup ``path`` and the cgroups below it, deepest first (empty ones only)."""
    for child in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        try:
            child.rmdir()
        except OSError:
            pass
    try:
        path.rmdir()
    except OSError:
        pass


def _kill_groups(groups: dict[str, int]) -> None:
    for pgid in groups.values():
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class Containment:
    """One job's cgroup (where one can be made) and the guardian that ends it with the launcher.

    Attributes:
        path: The job's cgroup directory, or None where no cgroup v2 hierarchy is writable.
    """

    def __init__(self) -> None:
        self.path: Path | None = None
        self._guardian: subprocess.Popen[str] | None = None

    def start(self) -> Containment:
        """Makes the job's cgroup (if it can) and starts the guardian."""
        parent = cgroup2_directory()
        if parent is not None:
            path = parent / f"tfdist-{os.getpid()}-{next(_names)}"
            try:
                path.mkdir()
                self.path = path
            except OSError:
                self.path = None
        self._guardian = subprocess.Popen(
            [sys.executable, "-m", "tfdist.launcher.containment", str(self.path or "")],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, start_new_session=True,
        )
        return self

    def joiner(self, task: str) -> Callable[[], None]:
        """A ``preexec_fn`` step that puts the child in task ``task``'s cgroup (made now)."""
        if self.path is None:
            return lambda: None
        procs = _task_directory(self.path, task) / "cgroup.procs"
        procs.parent.mkdir(exist_ok=True)

        def join() -> None:  # pragma: no cover - runs in the child between fork and exec
            try:
                procs.write_text("0")
            except OSError as err:  # never run a task the job cannot stop
                os.write(2, f"tfdist: cannot enter the job's cgroup {procs}: {err}\n".encode())
                os._exit(126)

        return join

    def watch_group(self, task: str, pgid: int) -> None:
        """Tells the guardian task ``task``'s process group (its latest ``pgid``), which it kills
        if the launcher dies and the job has no cgroup (a cgroup holds every group already)."""
        self._tell(f"{task} {pgid}")

    def _tell(self, line: str) -> None:
        if self._guardian is not None and self._guardian.stdin is not None:
            try:
                self._guardian.stdin.write(line + "\n")
                self._guardian.stdin.flush()
            except BrokenPipeError:
                pass

    def kill(self, task: str | None = None) -> list[int]:
        """SIGKILLs every process of task ``task`` (default: of the whole job); waits for them.

        Returns:
            The processes still alive after the deadline (``[]``: none; always without cgroup).
        """
        if self.path is None:
            return []
        return kill_cgroup(self.path if task is None else _task_directory(self.path, task))

    def close(self) -> None:
        """Ends the guardian, which kills what is left of the job and removes its cgroup."""
        self._tell(_CLOSED)  # the launcher stopped its tasks: their group ids may be reused
        guardian, self._guardian = self._guardian, None
        if guardian is None:
            return
        if guardian.stdin is not None:
            guardian.stdin.close()
        try:
            guardian.wait(timeout=_CLOSE_TIMEOUT)
        except subprocess.TimeoutExpired:
            guardian.kill()
            guardian.wait()
        if self.path is not None:
            remove_cgroup(self.path)


def guard(path: str) -> int:
    """The guardian: reads ``TASK PGID`` lines until end of file, then kills the job's cgroup
    (or, without one, each task's last process group unless the launcher said it closed)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the launcher's to handle
    groups: dict[str, int] = {}
    closed = False
    for line in sys.stdin:
        task, _, pgid = line.strip().rpartition(" ")
        closed = closed or line.strip() == _CLOSED
        if pgid.isdigit():
            groups[task] = int(pgid)
    if not path and not closed:
        _kill_groups(groups)
    if path:
        kill_cgroup(Path(path))
        remove_cgroup(Path(path))
    return 0


if __name__ == "__main__":
    sys.exit(guard(sys.argv[1] if len(sys.argv) > 1 else ""))
