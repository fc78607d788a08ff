"""The Ray actor of one task of a job run by `tfdist.launcher.ray.gang` (runs on its node).

The runner creates one per task, inside the job's placement group. The actor reserves a port on
its node's address (`locate`), then runs the task's command as a child process (`start`, through
`ProcessGroup`: its own session, output prefixed with the task's name, killed with the actor),
and answers the runner's polls with the child's status and new output. It never decides
anything: restarts and stops are the runner's calls.

Example:
    Outside Ray it is a plain object (``ray.remote(TaskActor)`` makes it an actor)::

    >>> import sys
    >>> actor = TaskActor()
    >>> pid = actor.start("chief:0", [sys.executable, "-c", "print('hi')"], {}, ".", "main", None,
    ...                   unset=())
    >>> actor.wait(timeout=30)
    (0, '[chief:0] hi\\n')
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tfdist.core.traits import TaskKind

__all__ = ["TaskActor"]


class TaskActor:
    """The Ray actor of one task: reserves its port, runs its command, keeps its output."""

    def __init__(self) -> None:
        self._group: Any = None
        self._name = ""
        self._lines: list[str] = []
        self._lock = threading.Lock()

    def write(self, text: str) -> None:  # the ProcessGroup's output stream
        with self._lock:
            self._lines.append(text)

    def flush(self) -> None:
        pass

    def locate(self) -> dict[str, Any]:
        """Its node's address, a port reserved there, and the interface holding the address."""
        import ray

        from tfdist.cluster.ports import reserve_ports
        from tfdist.launcher.hosts.layout import interface_towards

        address = ray.util.get_node_ip_address()
        return {"address": address, "port": reserve_ports(1, host=address)[0],
                "interface": interface_towards(address) or "lo", "hostname": socket.gethostname()}

    def start(self, name: str, command: Sequence[str], env: Mapping[str, str], cwd: str,
              kind: TaskKind, log_dir: str | None, unset: Sequence[str],
              max_restarts: int = 0, show: Callable[[str], bool] | None = None) -> int:
        """Runs ``command`` (its environment: this node's, less ``unset``, plus ``env``);
        ``max_restarts``: the runner's budget for `restart` (its `Supervisor` decides); ``show``:
        which lines are passed on (all are kept in its tail and log)."""
        from tfdist.launcher.process import ProcessGroup

        self._name = name
        self._group = ProcessGroup(stream=self, log_dir=log_dir)  # type: ignore[arg-type]
        environ = {k: v for k, v in os.environ.items() if k not in unset}
        started = self._group.start(name, command, env={**environ, **env}, kind=kind,
                                    cwd=cwd if os.path.isdir(cwd) else None,
                                    max_restarts=max_restarts, show=show)
        return started.pid

    def poll(self) -> tuple[int | None, str]:
        """Its exit status (None: running) and the output printed since the last poll (once it
        has exited: all of it)."""
        task = self._group.tasks[self._name]
        if task.returncode is not None:
            task.reader.join(timeout=5)
        with self._lock:
            lines, self._lines = "".join(self._lines), []
        return task.returncode, lines

    def tail(self, lines: int = 20) -> str:
        return str(self._group.tail(self._name, lines))

    def restart(self) -> int:
        return int(self._group.restart(self._name))

    def wait(self, timeout: float) -> tuple[int | None, str]:
        """`poll` once its task has exited, or after ``timeout`` seconds."""
        try:
            self._group.tasks[self._name].popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        return self.poll()

    def stop(self, grace: float) -> tuple[int | None, str]:
        """Stops its task (SIGTERM, SIGKILL after ``grace``); `poll` after (None: never
        started)."""
        from tfdist.cluster.ports import held_ports, release_ports

        release_ports(held_ports())
        if self._group is None:
            return None, ""
        self._group.stop(grace_period=grace)
        return self.poll()
