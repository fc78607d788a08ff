"""A deadline on joining a cluster, which TensorFlow itself may wait for forever.

Creating a ``MultiWorkerMirroredStrategy`` (or connecting a ParameterServer coordinator) blocks in
C++ until every peer has started; a peer that never comes (a typo in its address, a crashed task)
leaves the others waiting with no message. That C++ call holds Python's GIL, so neither a signal
handler nor a watchdog thread can run meanwhile. `startup_deadline` therefore starts a tiny
watchdog *process* (plain Python, no TensorFlow): if the ``with`` block has not finished in time,
it prints one error naming the tasks whose ports do not answer, and kills this process with
``SIGKILL`` (exit status -9; the launcher then reports the failed task by name). While it waits,
it prints a progress line every `progress_interval` seconds naming the peers that have joined
and those that have not, so a hang is never silent.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator

from tfdist.cluster import ClusterSpec, Task
from tfdist.errors import format_error

__all__ = [
    "startup_deadline",
    "resolve_startup_timeout",
    "MISSING_PLACEHOLDER",
    "STARTUP_TIMEOUT_ENV",
    "DEFAULT_STARTUP_TIMEOUT",
]

MISSING_PLACEHOLDER = "{missing}"
STARTUP_TIMEOUT_ENV = "TFDIST_STARTUP_TIMEOUT"
DEFAULT_STARTUP_TIMEOUT = 600.0
"""Seconds a task waits for its peers by default: long enough for a scheduler to start them all."""
_NO_DEADLINE = ("0", "none", "off", "inf")


def resolve_startup_timeout(seconds: float | None) -> float | None:
    """The deadline to use: ``seconds`` if given, else ``$TFDIST_STARTUP_TIMEOUT``, else 600 s.

    ``TFDIST_STARTUP_TIMEOUT=none`` (or ``0``, ``off``, ``inf``) waits forever, TF's own behaviour.

    Example:
        >>> resolve_startup_timeout(30)
        30
        >>> resolve_startup_timeout(None) in (DEFAULT_STARTUP_TIMEOUT, None) or "env override"
        True
    """
    if seconds is not None:
        return seconds
    text = os.environ.get(STARTUP_TIMEOUT_ENV, "").strip().lower()
    if not text:
        return DEFAULT_STARTUP_TIMEOUT
    if text in _NO_DEADLINE:
        return None
    try:
        return float(text)
    except ValueError:
        raise ValueError(
            format_error(
                f"{STARTUP_TIMEOUT_ENV} is not a number of seconds.",
                received=repr(text),
                expected="seconds such as 600, or 'none' to wait forever",
                fix=f"export {STARTUP_TIMEOUT_ENV}=600",
            )
        ) from None

_WATCHDOG = r"""
import json, os, select, signal, socket, sys, time
cfg = json.loads(sys.argv[1])

def answering():
    up, down = [], []
    for name, address in cfg["peers"]:
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=1).close()
            up.append(name)
        except OSError:
            down.append(name)
    return up, down

start = time.monotonic()
deadline = start + cfg["seconds"]
while True:
    left = deadline - time.monotonic()
    if left <= 0:
        break
    if select.select([sys.stdin], [], [], min(cfg["interval"], left))[0]:
        sys.exit(0)
    if deadline - time.monotonic() > 0:
        up, down = answering()
        sys.stderr.write("tfdist: %s waiting for its cluster (%.0f of %g s): joined: %s; not yet: "
                         "%s\n" % (cfg["me"], time.monotonic() - start, cfg["seconds"],
                                    ", ".join(up) or "none", ", ".join(down) or "none"))
        sys.stderr.flush()
_, missing = answering()
text = cfg["message"].replace("{missing}", ", ".join(missing) or "(all ports answer)")
sys.stderr.write("tfdist: " + text + "\n")
sys.stderr.flush()
os.kill(cfg["pid"], signal.SIGKILL)
"""


def progress_interval(seconds: float) -> float:
    """Seconds between the watchdog's progress lines: a fifth of the deadline, 1 to 30 s.

    Example:
        >>> progress_interval(600), progress_interval(2)
        (30, 1)
    """
    return min(30, max(1, seconds / 5))


def _message(what: str, seconds: float, cluster: ClusterSpec, me: Task | None) -> str:
    return format_error(
        f"{what} did not join its cluster within {seconds:g} s; the process is killed.",
        received=f"task {me}, no answer from: {MISSING_PLACEHOLDER}",
        expected=f"every task of {cluster.as_dict()} started",
        fix="start the missing tasks, check their addresses in TF_CONFIG, or raise "
        "startup_timeout_seconds",
    )


@contextlib.contextmanager
def startup_deadline(
    seconds: float | None, cluster: ClusterSpec, me: Task | None, what: str
) -> Iterator[None]:
    """Kills this process if the ``with`` block runs longer than ``seconds`` (None: no deadline).

    Example:
        >>> with startup_deadline(30, ClusterSpec(worker=["localhost:2222"]), None, "a step"):
        ...     pass
    """
    if seconds is None:
        yield
        return
    peers = [(str(t), cluster.address(t)) for t in cluster.tasks() if t != me]
    config = {"seconds": seconds, "peers": peers, "pid": os.getpid(), "me": str(me or "this task"),
              "interval": progress_interval(seconds),
              "message": _message(what, seconds, cluster, me)}
    watchdog = subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, json.dumps(config)],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        assert watchdog.stdin is not None
        watchdog.stdin.close()  # EOF: the block is done; the watchdog exits.
        watchdog.wait()
