"""``python -m tfdist.launcher.hosts.remote -- ARGV``: the remote side of a task started over ssh.

Killing a local ``ssh`` client does not kill the command it started on the remote host: sshd
closes the session and exits, but sends the command no signal (there is no terminal), so the task
is re-parented and runs on. A launcher that stops a task, or dies, would leave it running. This
wrapper, which sshd starts in place of the task (``exec``, so sshd's session process is its
parent), closes that gap:

* it asks the kernel for SIGHUP when its parent exits (``PR_SET_PDEATHSIG``): the ssh connection
  closed, whether the launcher stopped the ssh client, exited or died;
* it starts ``ARGV`` in a new session (its own process group), with ``PR_SET_PDEATHSIG`` =
  SIGKILL so the task also dies if the wrapper itself is killed outright;
* with ``--watch-stdin``, end-of-file on its stdin (the ssh channel) stops the task too, for
  launchers that keep the ssh client's stdin open and never write to it;
* on SIGHUP, SIGTERM, SIGINT (or stdin end-of-file) it sends SIGTERM to the task's whole process
  group, then SIGKILL after a grace period;
* when the task exits by itself, whatever it left in its process group is killed, and the
  wrapper exits with the task's status (``128 + N`` for a task killed by signal N), which ssh
  passes back to the launcher.

Example:
    Run by `tfdist.launcher.hosts.ssh`, not by hand::

        ssh n2 'cd /work && exec env TF_CONFIG=... \
            python -m tfdist.launcher.hosts.remote -- python t.py'
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from tfdist.launcher.process import _die_with_parent

__all__ = ["run", "main"]

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
_PR_SET_PDEATHSIG = 1


def _signal_on_parent_death(sig: signal.Signals) -> None:
    """Asks the kernel to send ``sig`` to this process when its parent exits (Linux only)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))
    except OSError:
        pass


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class _Stopper:
    """Stops the task's process group once: SIGTERM, then SIGKILL after ``grace`` seconds."""

    def __init__(self, child: subprocess.Popen[bytes], grace: float) -> None:
        self._child = child
        self._grace = grace
        self._once = threading.Lock()
        self.reason: str | None = None

    def stop(self, reason: str) -> None:
        if not self._once.acquire(blocking=False):
            return
        self.reason = reason
        threading.Thread(target=self._terminate, name="tfdist-remote-stop", daemon=True).start()

    def _terminate(self) -> None:
        _signal_group(self._child.pid, signal.SIGTERM)
        try:
            self._child.wait(timeout=self._grace)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(self._child.pid, signal.SIGKILL)


def _watch_stdin(stopper: _Stopper) -> None:
    """Returns (and stops the task) when stdin reaches end-of-file or fails."""
    try:
        while os.read(0, 65536):
            pass
    except OSError:
        pass
    stopper.stop("the ssh connection closed (stdin reached end-of-file)")


def read_env_line(fd: int = 0) -> dict[str, str]:
    """Reads one JSON object line from ``fd`` (the launcher's `env_payload`), byte by byte so
    that nothing after the line is consumed.

    Raises:
        ValueError: The line is not a JSON object of strings.
    """
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            break
        data += chunk
    env = json.loads(data.decode() or "null")
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ValueError(f"expected a JSON object of strings on stdin, got {data[:80]!r}")
    return env


def run(argv: Sequence[str], *, grace: float = 5.0, watch_stdin: bool = False,
        env: dict[str, str] | None = None) -> int:
    """Runs ``argv`` until it exits, the parent exits, a stop signal arrives, or stdin closes.

    Args:
        argv: The task's command.
        grace: Seconds between SIGTERM and SIGKILL when stopping the task.
        watch_stdin: Also stop the task when stdin reaches end-of-file.
        env: Variables set for the task on top of this process's environment.

    Returns:
        The task's exit status (``128 + N`` if a signal N ended it).

    Example:
        >>> import sys
        >>> run([sys.executable, "-c", "raise SystemExit(3)"])
        3
    """
    parent = os.getppid()
    _signal_on_parent_death(signal.SIGHUP)
    try:
        child = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=_die_with_parent, env={**os.environ, **(env or {})},
        )
    except OSError as error:
        print(f"[tfdist.launcher.hosts.remote] cannot start {argv[0]!r}: {error}", file=sys.stderr)
        return 127
    stopper = _Stopper(child, grace)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopper.stop(f"received {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, on_signal) for sig in _STOP_SIGNALS}
    if os.getppid() != parent:  # The parent exited before the kernel was asked to tell us.
        stopper.stop("the parent (the ssh session) exited before the task started")
    if watch_stdin:
        threading.Thread(target=_watch_stdin, args=(stopper,), name="tfdist-remote-stdin",
                         daemon=True).start()
    try:
        code = child.wait()
    finally:
        _signal_group(child.pid, signal.SIGKILL)  # Whatever the task left in its group.
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stopper.reason is not None:
        print(f"[tfdist.launcher.hosts.remote] stopped the task: {stopper.reason}", file=sys.stderr,
              flush=True)
    return 128 - code if code < 0 else code


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses ``[--grace S] -- ARGV``.

    Example:
        >>> parse_args(["--grace", "2", "--", "python", "-u", "t.py"]).command
        ['python', '-u', 't.py']
    """
    parser = argparse.ArgumentParser(
        prog="python -m tfdist.launcher.hosts.remote",
        description="Run a task; stop its whole process group when this wrapper's parent (the "
        "ssh session) exits, on SIGTERM/SIGHUP/SIGINT, or (--watch-stdin) when stdin closes.",
    )
    parser.add_argument("--grace", type=float, default=5.0,
                        help="seconds between SIGTERM and SIGKILL when stopping (default 5)")
    parser.add_argument("--watch-stdin", action="store_true",
                        help="also stop the task when stdin reaches end-of-file")
    parser.add_argument("--env-stdin", action="store_true",
                        help="first read the task's environment from stdin, one JSON object line "
                        "(so that it is never on a command line)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the task's argv")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("missing the task's command. Received: nothing after '--'. Expected: "
                     "-- ARGV. Fix: python -m tfdist.launcher.hosts.remote -- python t.py")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the task's exit status."""
    args = parse_args(argv)
    env = None
    if args.env_stdin:
        try:
            env = read_env_line()
        except ValueError as err:
            print(f"[tfdist.launcher.hosts.remote] cannot read the task's environment: {err}",
                  file=sys.stderr)
            return 2
    return run(args.command, grace=args.grace, watch_stdin=args.watch_stdin, env=env)


if __name__ == "__main__":
    sys.exit(main())
