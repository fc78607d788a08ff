"""Run a job's tasks as child processes and stop them together.

A `ProcessGroup` owns every process of one job. It starts each task in its own session (so the
task and anything it spawns can be signalled as one process group), streams the task's output line
by line with a ``[worker:1]`` prefix, keeps the last lines of each task for error reports, and stops
every task (SIGTERM, then SIGKILL after a grace period) when one fails, when the job times out, or
when the group is left.

Children also ask the kernel to kill them if the process that started them dies
(``PR_SET_PDEATHSIG``), and each task runs in a cgroup of the job (`tfdist.launcher.containment`)
whose guardian kills it when the launcher ends or dies: so nothing a task starts, even a process
that left its group (``setsid``), outlives the job or a SIGKILLed launcher.

`wait` supervises the tasks with the one failure policy of every runner
(`tfdist.launcher.supervisor.Supervisor`; the group is its local `TaskGroup`). Tasks have a *kind*:

* ``"main"``: the job is done when every main task has exited with status 0.
* ``"service"``: runs until stopped (a ParameterServer worker or ps task); exiting on its own,
  with any status, before the main tasks are done is a failure.
* ``"sidecar"``: its failure is reported but does not stop the job (an evaluator). Once every main
  task has succeeded, a sidecar still running gets up to ``sidecar_grace`` seconds to finish on
  its own (an evaluator evaluating the chief's last checkpoint), then it is stopped.

A task may be started with a line filter (`tfdist.launcher.output`): lines it rejects are not
printed, but still kept in the task's tail and log. The tail of such a task is printed when it
fails, even if the job goes on (a sidecar, a task restarted alone).

A task started with ``max_restarts=N`` that fails (a ParameterServer worker: TF's
``ClusterCoordinator`` re-dispatches its work once it is back) is restarted alone, with the same
command and environment, up to N times; each restart is announced. Its next failure stops the job.
Tasks started on other hosts are local ``ssh`` processes (`tfdist.launcher.hosts.ssh`) of this
group.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from tfdist.core.traits import TaskKind
from tfdist.errors import LaunchError
from tfdist.launcher.containment import Containment
from tfdist.launcher.output import LineFilter, RankFailure, TaskOutput
from tfdist.launcher.supervisor import Member, Supervisor

_PR_SET_PDEATHSIG = 1
_TAIL_LINES = 40
_POLL_SECONDS = 0.05


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Makes the kernel SIGKILL this child when its parent thread exits (Linux only)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def _is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state ``T``) or stopped by a tracer (``t``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] in (["T"], ["t"])


@dataclasses.dataclass
class TaskProcess:
    """One running task of a `ProcessGroup`."""

    name: str
    kind: TaskKind
    popen: subprocess.Popen[bytes]
    tail: TaskOutput
    reader: threading.Thread
    argv: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    cwd: str | os.PathLike[str] | None = None
    max_restarts: int = 0
    restarts: int = 0
    stdin: str | None = None
    show: LineFilter | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def output_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines the task printed."""
        return self.tail.last(lines)


class ProcessGroup:
    """Starts tasks, streams their output, and stops all of them together.

    Example:
        >>> import sys
        >>> with ProcessGroup(stream=sys.stdout) as group:
        ...     _ = group.start("worker:0", [sys.executable, "-c", "print('hi')"])
        ...     group.wait(timeout=30)
        [worker:0] hi
        {'worker:0': 0}
    """

    poll_interval = _POLL_SECONDS

    def __init__(
        self,
        *,
        stream: IO[str] | None = None,
        grace_period: float = 5.0,
        log_dir: str | os.PathLike[str] | None = None,
        sidecar_grace: float = 0.0,
        join_network: Callable[[], None] | None = None,
    ) -> None:
        """Creates an empty group.

        Args:
            stream: Where prefixed task output goes (default ``sys.stdout``); ``None`` for stdout.
            grace_period: Seconds between SIGTERM and SIGKILL when stopping tasks.
            log_dir: If set, each task's raw output is also written to ``<log_dir>/<task>.log``.
            sidecar_grace: Seconds sidecars may keep running, to finish on their own, once every
                main task has succeeded (default 0: they are stopped at once).
            join_network: Called in each child before exec, e.g. `PrivateNetwork.join`.
        """
        if sidecar_grace < 0:
            raise ValueError(f"sidecar_grace must be 0 or more seconds. Received: {sidecar_grace}")
        self._sidecar_grace = sidecar_grace
        self._stream = stream
        self._grace_period = grace_period
        self._log_dir = os.fspath(log_dir) if log_dir is not None else None
        self._join_network = join_network
        self._lock = threading.Lock()
        self._containment: Containment | None = None
        self.tasks: dict[str, TaskProcess] = {}
        self.sidecar_failures: dict[str, int] = {}
        self.output_failures: dict[str, str] = {}
        self._muted = False

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        kind: TaskKind = "main",
        max_restarts: int = 0,
        stdin: str | None = None,
        show: LineFilter | None = None,
    ) -> TaskProcess:
        """Starts one task. ``env`` replaces the environment (pass ``{**os.environ, ...}``).

        ``max_restarts``: how many times the task is restarted alone when it fails (default 0).
        ``stdin``: text written to the task's stdin at each start, then closed (default: none).
        ``show``: which of its lines are printed (default: all); all are kept in tail and log.
        """
        if name in self.tasks:
            raise LaunchError(f"Task {name} was started twice in one group.")
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be 0 or more. Received: {max_restarts}")
        tail = TaskOutput(maxlen=_TAIL_LINES)
        popen, reader = self._spawn(name, argv, env, cwd, tail, log_mode="w", stdin=stdin,
                                    show=show)
        task = TaskProcess(
            name=name, kind=kind, popen=popen, tail=tail, reader=reader, argv=tuple(argv),
            env=env, cwd=cwd, max_restarts=max_restarts, stdin=stdin, show=show,
        )
        self.tasks[name] = task
        reader.start()
        return task

    def _spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | os.PathLike[str] | None,
        tail: TaskOutput,
        log_mode: str,
        stdin: str | None = None,
        show: LineFilter | None = None,
    ) -> tuple[subprocess.Popen[bytes], threading.Thread]:
        if self._containment is None:
            self._containment = Containment().start()
        join_cgroup = self._containment.joiner(name)
        popen = subprocess.Popen(
            list(argv),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: self._prepare_child(join_cgroup),
        )
        self._containment.watch_group(name, popen.pid)
        if stdin is not None:
            assert popen.stdin is not None
            try:
                popen.stdin.write(stdin.encode())
                popen.stdin.close()
            except BrokenPipeError:  # it died at once; its status tells why
                pass
        reader = threading.Thread(
            target=self._pump, args=(name, popen, tail, log_mode, show), name=f"output-{name}",
            daemon=True,
        )
        return popen, reader

    def _prepare_child(self, join_cgroup: Callable[[], None]) -> None:  # pragma: no cover
        _die_with_parent()
        join_cgroup()
        if self._join_network is not None:
            self._join_network()

    def restart(self, name: str) -> int:
        """Starts the exited task ``name`` again, alone (same argv, env and cwd); its new pid.

        `wait` does this for tasks started with ``max_restarts``, as `Supervisor` decides.
        """
        task = self.tasks[name]
        _signal_group(task.popen, signal.SIGKILL)  # leftovers of its process group
        if self._containment is not None:
            self._containment.kill(name)  # and those that left it
        task.reader.join(timeout=5)
        task.restarts += 1
        task.popen, task.reader = self._spawn(
            task.name, task.argv, task.env, task.cwd, task.tail, log_mode="a", stdin=task.stdin,
            show=task.show,
        )
        task.reader.start()
        return task.pid

    def _pump(
        self,
        name: str,
        popen: subprocess.Popen[bytes],
        tail: TaskOutput,
        log_mode: str = "w",
        show: LineFilter | None = None,
    ) -> None:
        log = self._open_log(name, log_mode)
        assert popen.stdout is not None
        try:
            for raw in iter(popen.stdout.readline, b""):
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                tail.append(line)
                if log is not None:
                    try:
                        log.write(line + "\n")
                        log.flush()
                    except OSError as err:  # keep draining the pipe: a full pipe hangs the task
                        self.output_failures.setdefault(name, f"cannot write its log: {err}")
                        log = None
                if self._muted or (show is not None and not show(line)):
                    continue
                with self._lock:
                    stream = self._stream or sys.stdout
                    stream.write(f"[{name}] {line}\n")
                    stream.flush()
        except Exception as err:  # noqa: BLE001 - any failure of the output path fails the job
            self.output_failures.setdefault(name, f"its output could not be read: {err!r}")
        finally:
            if log is not None:
                log.close()

    def _open_log(self, name: str, log_mode: str) -> IO[str] | None:
        if self._log_dir is None:
            return None
        try:
            os.makedirs(self._log_dir, exist_ok=True)
            return open(os.path.join(self._log_dir, f"{name.replace(':', '_')}.log"), log_mode)
        except OSError as err:
            self.output_failures.setdefault(name, f"cannot write its log: {err}")
            return None

    def wait(self, timeout: float) -> dict[str, int | None]:
        """Waits until every main task has succeeded, then stops the rest (`Supervisor.watch`).

        Returns:
            Exit status per task (services and sidecars stopped by the group report theirs).

        Raises:
            TaskFailedError: A main or service task failed; every other task has been stopped.
            TaskTimeoutError: ``timeout`` seconds passed first; every task has been stopped.
        """
        supervisor = Supervisor(timeout=timeout, sidecar_grace=self._sidecar_grace)
        self.sidecar_failures = supervisor.sidecar_failures
        return supervisor.watch(self)

    # The `TaskGroup` that `Supervisor` drives.

    def launch(self) -> None:
        """Nothing: this group's tasks are started one by one, with `start`."""

    def members(self) -> list[Member]:
        """Its tasks, as the supervisor sees them."""
        return [Member(t.name, t.kind, t.max_restarts, "all" if t.show is None else "filtered")
                for t in self.tasks.values()]

    def poll(self) -> dict[str, int | None]:
        """Each task's exit status (None: running).

        Raises:
            LaunchError: A task's output could not be read or logged (a full pipe would hang it).
        """
        if self.output_failures:
            name, why = next(iter(self.output_failures.items()))
            raise LaunchError(f"Task {name}: {why}. Every task was stopped. Fix: pass a "
                              "--log-dir that can be created and written, or none")
        return {name: task.returncode for name, task in self.tasks.items()}

    def tail(self, name: str, lines: int = 20) -> str:
        """The last ``lines`` lines task ``name`` printed (all of them, once it has exited)."""
        task = self.tasks[name]
        if task.returncode is not None:
            task.reader.join(timeout=5)  # its last lines are on their way
        return task.output_tail(lines)

    def stopped(self) -> list[str]:
        """The running tasks whose process is stopped (SIGSTOP, a debugger, job control)."""
        return [name for name, task in self.tasks.items()
                if task.returncode is None and _is_stopped(task.pid)]

    def failed_within(self, name: str) -> RankFailure | None:
        """The rank that task ``name`` (``horovodrun``) reported failed first, its exit status
        and its last lines; None for a task that runs no ranks, or reported none failed."""
        task = self.tasks[name]
        if task.returncode is not None:
            task.reader.join(timeout=5)
        return task.tail.failed_rank()

    def announce(self, message: str) -> None:
        """Prints ``[tfdist] message`` among the tasks' output."""
        with self._lock:
            stream = self._stream or sys.stdout
            stream.write(f"[tfdist] {message}\n")
            stream.flush()

    def mute(self) -> None:
        """Prints no more task output (tails and logs still get every line)."""
        self._muted = True

    def written(self) -> dict[str, str]:
        """What the tasks reported writing (`tfdist.logs.WROTE_MARKER`): path -> what."""
        found: dict[str, str] = {}
        for task in self.tasks.values():
            found.update(task.tail.written)
        return found

    def stop(self, grace_period: float | None = None) -> dict[str, int | None]:
        """Stops every task that is still running: SIGTERM, then SIGKILL after the grace period.

        Signals go to each task's whole process group, so its own children stop too; then
        every process left in the job's cgroup (one that left its group) is SIGKILLed.

        Returns:
            Each task's exit status.
        """
        grace = self._grace_period if grace_period is None else grace_period
        running = [t for t in self.tasks.values() if t.returncode is None]
        for task in running:
            _signal_group(task.popen, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for task in running:
            try:
                task.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for task in self.tasks.values():
            # Also reaps leftovers of tasks that exited but left children in their group.
            _signal_group(task.popen, signal.SIGKILL)
            task.popen.wait()
        self._end_containment()
        for task in self.tasks.values():
            task.reader.join(timeout=5)
        return {name: task.popen.returncode for name, task in self.tasks.items()}

    def _end_containment(self) -> None:
        """Kills what is left in the job's cgroup, ends its guardian, removes the cgroup."""
        containment, self._containment = self._containment, None
        if containment is None:
            return
        left = containment.kill()
        containment.close()
        if left:
            self.announce(f"warning: processes {left} of the job did not end within seconds of "
                          "SIGKILL (stuck in the kernel?); they may outlive the job")


def _signal_group(popen: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(popen.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
