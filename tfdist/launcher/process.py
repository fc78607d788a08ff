"""Run a job's tasks as child processes and stop them together.

A `ProcessGroup` owns every process of one job. It starts each task in its own session (so the
task and anything it spawns can be signalled as one process group), streams the task's output line
by line with a ``[worker:1]`` prefix, keeps the last lines of each task for error reports, and stops
every task (SIGTERM, then SIGKILL after a grace period) when one fails, when the job times out, or
when the group is left.

Children also ask the kernel to kill them if the process that started them dies
(``PR_SET_PDEATHSIG``), so a launcher that is itself SIGKILLed leaves no task behind.

Tasks have a *kind*:

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
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Literal

from tfdist.errors import LaunchError, TaskFailedError, TaskTimeoutError
from tfdist.launcher.output import LineFilter

TaskKind = Literal["main", "service", "sidecar"]

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


@dataclasses.dataclass
class TaskProcess:
    """One running task of a `ProcessGroup`."""

    name: str
    kind: TaskKind
    popen: subprocess.Popen[bytes]
    tail: collections.deque[str]
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
        return "\n".join(list(self.tail)[-lines:])


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
        self.tasks: dict[str, TaskProcess] = {}
        self.sidecar_failures: dict[str, int] = {}
        self.output_failures: dict[str, str] = {}

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
        tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
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
        tail: collections.deque[str],
        log_mode: str,
        stdin: str | None = None,
        show: LineFilter | None = None,
    ) -> tuple[subprocess.Popen[bytes], threading.Thread]:
        popen = subprocess.Popen(
            list(argv),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=self._prepare_child,
        )
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

    def _prepare_child(self) -> None:  # pragma: no cover - runs in the child before exec
        _die_with_parent()
        if self._join_network is not None:
            self._join_network()

    def restart(self, name: str) -> TaskProcess:
        """Starts the exited task ``name`` again, alone (same argv, env and cwd); announces it.

        `wait` does this itself for tasks started with ``max_restarts``; a runner that applies
        the restart policy elsewhere (`tfdist.launcher.ray_runner`) calls it.
        """
        task = self.tasks[name]
        self._restart(task)
        return task

    def _restart(self, task: TaskProcess) -> None:
        """Starts ``task`` again (same argv, env and cwd) after it failed."""
        code = task.popen.returncode
        _signal_group(task.popen, signal.SIGKILL)  # leftovers of its process group
        task.reader.join(timeout=5)
        task.restarts += 1
        self._announce(
            f"{task.name} exited with status {code}; restarting it alone "
            f"({task.restarts}/{task.max_restarts}){self._hidden_tail(task)}"
        )
        task.popen, task.reader = self._spawn(
            task.name, task.argv, task.env, task.cwd, task.tail, log_mode="a", stdin=task.stdin,
            show=task.show,
        )
        task.reader.start()
        self._announce(f"{task.name} restarted (pid {task.pid})")

    def _pump(
        self,
        name: str,
        popen: subprocess.Popen[bytes],
        tail: collections.deque[str],
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
                if show is not None and not show(line):
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

    def wait(self, timeout: float) -> dict[str, int]:
        """Waits until every main task has succeeded, then stops the rest.

        Returns:
            Exit status per task (services and sidecars stopped by the group report theirs).

        Raises:
            TaskFailedError: A main or service task failed; every other task has been stopped.
            TaskTimeoutError: ``timeout`` seconds passed first; every task has been stopped.
        """
        deadline = time.monotonic() + timeout
        main = [t for t in self.tasks.values() if t.kind == "main"]
        if not main:
            raise LaunchError("A job needs at least one main task to wait for.")
        while True:
            if self.output_failures:
                name, why = next(iter(self.output_failures.items()))
                self.stop()
                raise LaunchError(f"Task {name}: {why}. Every task was stopped. Fix: pass a "
                                  "--log-dir that can be created and written, or none")
            failed = self._first_failure()
            if failed is not None:
                self.stop()
                raise TaskFailedError(failed.name, failed.popen.returncode, failed.output_tail())
            if all(t.returncode == 0 for t in main):
                break
            if time.monotonic() > deadline:
                running = [t.name for t in main if t.returncode is None]
                self.stop()
                raise TaskTimeoutError(
                    f"The job did not finish within {timeout:g} s; still running: "
                    f"{', '.join(running)}. Every task was stopped. Fix: raise the timeout, or "
                    f"check these tasks' output for a hang (a wrong address in TF_CONFIG waits "
                    f"forever for its peers)."
                )
            time.sleep(_POLL_SECONDS)
        self._wait_for_sidecars(min(self._sidecar_grace, max(0.0, deadline - time.monotonic())))
        self.stop()
        return {name: task.popen.returncode for name, task in self.tasks.items()}

    def _wait_for_sidecars(self, grace: float) -> None:
        """Gives running sidecars up to ``grace`` seconds to exit on their own."""
        running = [t for t in self.tasks.values() if t.kind == "sidecar" and t.returncode is None]
        if not running or grace <= 0:
            return
        names = ", ".join(t.name for t in running)
        self._announce(f"main tasks done; waiting up to {grace:.3g} s for sidecar(s) {names}")
        deadline = time.monotonic() + grace
        while any(t.returncode is None for t in running) and time.monotonic() < deadline:
            time.sleep(_POLL_SECONDS)
        self._first_failure()  # reports a sidecar that failed meanwhile
        late = [t.name for t in running if t.returncode is None]
        if late:
            self._announce(f"sidecar(s) {', '.join(late)} still running after {grace:.3g} s; "
                           f"stopping them")

    def _first_failure(self) -> TaskProcess | None:
        main_done = all(t.returncode == 0 for t in self.tasks.values() if t.kind == "main")
        for task in self.tasks.values():
            code = task.returncode
            if code is None or (code == 0 and task.kind != "service"):
                continue
            if task.kind == "sidecar":
                if task.name not in self.sidecar_failures:
                    self.sidecar_failures[task.name] = code
                    self._announce(f"sidecar {task.name} exited with status {code}; job goes "
                                   f"on{self._hidden_tail(task)}")
                continue
            if task.kind == "service" and main_done:
                continue
            if task.restarts < task.max_restarts:
                self._restart(task)
                continue
            return task
        return None

    @staticmethod
    def _hidden_tail(task: TaskProcess) -> str:
        """The last lines of a task whose output is filtered, to append to a message about it."""
        if task.show is None:
            return ""
        task.reader.join(timeout=5)  # it exited: its last lines are on their way
        return f". Its last lines:\n{task.output_tail()}"

    def _announce(self, message: str) -> None:
        with self._lock:
            stream = self._stream or sys.stdout
            stream.write(f"[tfdist] {message}\n")
            stream.flush()

    def stop(self, grace_period: float | None = None) -> None:
        """Stops every task that is still running: SIGTERM, then SIGKILL after the grace period.

        Signals go to each task's whole process group, so its own children stop too.
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
        for task in self.tasks.values():
            task.reader.join(timeout=5)


def _signal_group(popen: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(popen.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
