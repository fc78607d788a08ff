"""`tfdist.launcher.hosts.remote`: the remote task stops with its ssh session (no TensorFlow,
seconds)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tfdist.testing import wait_gone

WRAPPER = [sys.executable, "-m", "tfdist.launcher.hosts.remote", "--grace", "2"]
# A task that records its pid and its child's, then sleeps (a child in its group must die too).
TASK = ("import os, subprocess, sys, time; c = subprocess.Popen(['sleep', '300']); "
        "open(sys.argv[1], 'w').write(f'{os.getpid()} {c.pid}'); time.sleep(300)")


def _task_pids(pid_file: Path, timeout: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the task did not start"
        time.sleep(0.05)
    return [int(pid) for pid in pid_file.read_text().split()]


def _all_gone(pids: list[int], timeout: float = 10) -> bool:
    return wait_gone(pids, timeout) == []


def test_task_and_its_children_die_when_stdin_closes(tmp_path):
    pid_file = tmp_path / "pids"
    wrapper = subprocess.Popen([*WRAPPER, "--watch-stdin", "--", sys.executable, "-c", TASK,
                                str(pid_file)], stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    pids = _task_pids(pid_file)
    time.sleep(0.3)
    assert wrapper.poll() is None, "an open stdin must not stop the task"
    assert wrapper.stdin is not None
    wrapper.stdin.close()  # what the remote side sees when the ssh connection closes
    assert wrapper.wait(timeout=10) == 128 + signal.SIGTERM
    assert _all_gone(pids), "the task or its child outlived the closed stdin"
    assert b"stdin reached end-of-file" in wrapper.stderr.read()


def test_task_dies_when_the_wrapper_parent_exits(tmp_path):
    """sshd's session process is the wrapper's parent; it exits when the connection closes."""
    pid_file = tmp_path / "pids"
    parent_code = ("import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); "
                   "time.sleep(300)")
    parent = subprocess.Popen([sys.executable, "-c", parent_code, *WRAPPER, "--",
                               sys.executable, "-c", TASK, str(pid_file)],
                              stdin=subprocess.DEVNULL)
    pids = _task_pids(pid_file)
    wrapper = [c.pid for c in psutil.Process(parent.pid).children()]
    parent.kill()
    parent.wait()
    assert _all_gone(pids + wrapper), "the task outlived its ssh session"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_stop_signal_stops_the_task_group(tmp_path, sig):
    pid_file = tmp_path / "pids"
    wrapper = subprocess.Popen([*WRAPPER, "--", sys.executable, "-c", TASK, str(pid_file)],
                               stdin=subprocess.DEVNULL)
    pids = _task_pids(pid_file)
    wrapper.send_signal(sig)
    assert wrapper.wait(timeout=10) == 128 + signal.SIGTERM  # the task got SIGTERM
    assert _all_gone(pids)


def test_exit_status_and_missing_command():
    ok = subprocess.run([*WRAPPER, "--", sys.executable, "-c", "raise SystemExit(7)"],
                        stdin=subprocess.DEVNULL, timeout=60)
    assert ok.returncode == 7
    missing = subprocess.run([*WRAPPER, "--", "/no/such/program"], stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 127 and "cannot start '/no/such/program'" in missing.stderr
