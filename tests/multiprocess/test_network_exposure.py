"""A local job's servers cannot be reached from this machine's non-loopback address (issue: a
client on the machine's own network address wrote a file as root through a local job's ps task).

Each case starts a real parameter-server job (a ps running ``tfdist.server``) whose chief checks
that the ps answers inside the job, then the test connects to the ps port from outside it. With
``--network host`` the same connection succeeds: that control shows the probe can fail.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).parent / "scripts" / "exposure_probe.py"
REPO_ROOT = Path(__file__).resolve().parents[2]


def _external_address() -> str | None:
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return address.address
    return None


def _connects(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


def _probe(network: str, tmp_path: Path) -> tuple[bool, dict[str, bool], str]:
    """Runs the job; returns (reachable inside the job, reachable from outside by address)."""
    done = tmp_path / f"done-{network}"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PROBE_DONE": str(done)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfdist.launcher.cli", "--network", network, "--ps", "1",
         "--workers", "1", "--timeout", "150", str(SCRIPT)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: list[str] = []
    try:
        port, inside = None, None
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "PS_PORT" in line:
                port = int(line.split("PS_PORT", 1)[1])
            if "REACHABLE_FROM_JOB" in line:
                inside = line.strip().endswith("True")
                break
        assert port is not None, "".join(lines)
        outside = {host: _connects(host, port) for host in (_external_address(), "127.0.0.1")}
        done.write_text("")
        proc.wait(timeout=120)
        lines.extend(proc.stdout)  # type: ignore[arg-type]
    finally:
        proc.kill()
        proc.wait()
    return bool(inside), outside, "".join(lines)


@pytest.mark.skipif(_external_address() is None, reason="this machine has no non-loopback IPv4")
@pytest.mark.skipif(os.geteuid() != 0, reason="a private network namespace needs root")
def test_a_local_job_listens_on_loopback_inside_the_job_only(tmp_path):
    inside, outside, out = _probe("private", tmp_path)
    assert "tasks share a private network with only loopback" in out
    assert inside, out  # the job itself works
    assert outside == {_external_address(): False, "127.0.0.1": False}, out

    inside, outside, out = _probe("host", tmp_path)  # control: the old exposure is real
    assert inside and outside[_external_address()], out
