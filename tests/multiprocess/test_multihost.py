"""tfdist-launch --hosts across real (fake) hosts: network namespaces, each with its own sshd.

The launcher runs inside host 0's namespace; tasks on hosts 1 and 2 start over ssh with their
own TF_CONFIG naming the 10.213.0.x addresses, and talk to each other over the bridge (Horovod
ranks: started by ``horovodrun``'s own ssh, Gloo over the bridge, no TF_CONFIG). Every
test also checks that nothing is left running on the remote hosts afterwards. See
`fake_hosts` for what is built (and removed, even when a test fails).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tfdist.testing import RESULT_DIR_ENV, _collect

sys.path.insert(0, str(Path(__file__).parent))
from fake_hosts import FakeHosts, missing_requirement  # noqa: E402

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).parent / "scripts"
LAUNCH = [sys.executable, "-m", "tfdist.launcher.cli"]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHosts]:
    reason = missing_requirement()
    if reason:
        pytest.skip(f"multi-host test {reason}")
    fake = FakeHosts.start(tmp_path_factory.mktemp("fake_hosts"), count=3, sshd_on=(1, 2))
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture(scope="module")
def loopback_named_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHosts]:
    """Hosts whose own hostname resolves to loopback (Debian maps it to 127.0.1.1)."""
    reason = missing_requirement()
    if reason:
        pytest.skip(f"multi-host test {reason}")
    fake = FakeHosts.start(tmp_path_factory.mktemp("loopback_named_hosts"), count=3,
                           sshd_on=(1, 2), label="l", own_hostnames=False)
    try:
        yield fake
    finally:
        fake.close()


def _launch(hosts: FakeHosts, results: Path, *argv: str,
            known_hosts: str | None = None, **env_extra: str) -> subprocess.Popen[str]:
    """Starts tfdist-launch in host 0's namespace, reaching the others over ssh."""
    env = {**os.environ, RESULT_DIR_ENV: str(results), "PYTHONPATH": str(REPO_ROOT), **env_extra}
    ssh = ["--ssh-port", str(hosts.ssh_port), "--ssh-identity", hosts.identity,
           "--ssh-known-hosts", known_hosts or hosts.known_hosts]
    return subprocess.Popen(
        hosts.exec_argv(0, [*LAUNCH, *ssh, *argv]), env=env, cwd=REPO_ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )


def _nothing_left(hosts: FakeHosts, timeout: float = 10) -> dict[int, list[int]]:
    """Waits for the remote hosts to have no process but their sshd; returns what is left."""
    deadline = time.monotonic() + timeout
    while True:
        left = {i: hosts.task_pids(i) for i in (1, 2) if hosts.task_pids(i)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _netns_inode(name: str) -> int:
    return os.stat(f"/run/netns/{name}").st_ino


def test_multi_worker_on_two_hosts_ends_with_identical_weights(hosts, tmp_path):
    h1, h2 = hosts.addresses[1], hosts.addresses[2]
    proc = _launch(hosts, tmp_path, "--hosts", f"{h1}:1,{h2}:1", "--workers", "2",
                   "--timeout", "80", str(SCRIPTS / "multihost_train.py"))
    out, _ = proc.communicate(timeout=100)
    assert proc.returncode == 0, out
    results = _collect(tmp_path)
    assert set(results) == {"worker:0", "worker:1"}, out
    w0, w1 = results["worker:0"], results["worker:1"]
    assert w0["num_workers"] == w1["num_workers"] == 2
    # Each worker ran in its own host's namespace, not in the launcher's.
    assert w0["netns"] == _netns_inode(hosts.namespaces[1])
    assert w1["netns"] == _netns_inode(hosts.namespaces[2])
    for a, b, start in zip(w0["weights"], w1["weights"], w0["initial"], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
        assert not np.allclose(a, start), "training did not change the weights"
    assert _nothing_left(hosts) == {}


def test_parameter_server_chief_here_worker_and_ps_remote_loss_falls(hosts, tmp_path):
    hosts_arg = ",".join(f"{address}:1" for address in hosts.addresses)
    proc = _launch(hosts, tmp_path, "--hosts", hosts_arg, "--ps", "1", "--workers", "1",
                   "--timeout", "80", str(SCRIPTS / "ps_train.py"), "0")
    out, _ = proc.communicate(timeout=100)
    assert proc.returncode == 0, out
    chief = _collect(tmp_path)["chief:0"]
    assert chief["num_workers"] == 1
    loss = chief["loss"]
    assert loss[-1] < 0.8 * loss[0], f"loss did not fall: {loss}"
    assert sum(map(sum, chief["seen"])) == 30, "every step ran on the remote worker"
    # The worker and ps services were stopped by closing their ssh sessions.
    assert _nothing_left(hosts) == {}


def test_an_unknown_host_key_stops_the_job_and_secrets_stay_here(hosts, tmp_path):
    """Host keys are checked by default; variables are sent only when named (--env)."""
    script = tmp_path / "env_probe.py"
    script.write_text(
        "import json, os\nfrom tfdist.testing import report\n"
        "report({k: os.environ.get(k) for k in ('TF_VAR_db_password', 'MY_SETTING')})\n")
    h1 = hosts.addresses[1]
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    proc = _launch(hosts, tmp_path, "--hosts", f"{h1}:1", "--workers", "1", "--strategy",
                   "multi_worker", "--timeout", "60", str(script), known_hosts=str(empty))
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode != 0 and "Host key verification failed" in out, out

    proc = _launch(hosts, tmp_path, "--hosts", f"{h1}:1", "--workers", "1", "--strategy",
                   "multi_worker", "--env", "MY_SETTING", "--timeout", "60", str(script),
                   TF_VAR_db_password="s3cret", MY_SETTING="on")
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, out
    assert _collect(tmp_path)["worker:0"] == {"TF_VAR_db_password": None, "MY_SETTING": "on"}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_remote_task_outlives_the_launcher(hosts, tmp_path, sig):
    script = tmp_path / "sleeper.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(300)\n")
    h1, h2 = hosts.addresses[1], hosts.addresses[2]
    proc = _launch(hosts, tmp_path, "--hosts", f"{h1}:1,{h2}:1", "--workers", "2", str(script))
    deadline = time.monotonic() + 30
    while not all(hosts.task_pids(i) for i in (1, 2)):
        assert time.monotonic() < deadline and proc.poll() is None, "remote tasks did not start"
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    assert _nothing_left(hosts) == {}, f"left on the remote hosts after {sig.name}"


def _running(hosts: FakeHosts, host: int, script: Path) -> list[int]:
    """The processes of host ``host`` whose argv includes ``script`` (a rank or its wrapper)."""
    found = []
    for pid in hosts.task_pids(host):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if str(script) in argv:
            found.append(pid)
    return found


@pytest.mark.horovod
def test_horovod_on_two_hosts_ends_with_identical_weights(
    loopback_named_hosts, tmp_path, monkeypatch
):
    """Also on hosts whose name resolves to loopback: Horovod 0.28.1's process-set Gloo device
    then bound to 127.0.0.1 and ranks could not connect; setup.sh patches it to use the
    interface horovodrun is given (``--network-interfaces``, which tfdist-launch passes)."""
    pytest.importorskip("horovod.tensorflow")
    hosts = loopback_named_hosts
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["x:1"]}, "task": {"index": 0}}')
    h1, h2 = hosts.addresses[1], hosts.addresses[2]
    proc = _launch(hosts, tmp_path, "--strategy", "horovod", "--hosts", f"{h1}:1,{h2}:1",
                   "--workers", "2", "--timeout", "80",
                   str(SCRIPTS / "multihost_horovod_train.py"))
    out, _ = proc.communicate(timeout=100)
    assert proc.returncode == 0, out
    results = _collect(tmp_path)
    assert set(results) == {"rank:0", "rank:1"}, out  # named by Horovod rank: no TF_CONFIG
    r0, r1 = results["rank:0"], results["rank:1"]
    assert r0["size"] == r1["size"] == 2
    assert r0["tf_config"] is None and r1["tf_config"] is None
    # Each rank ran in its own host's namespace, not in the launcher's.
    assert r0["netns"] == _netns_inode(hosts.namespaces[1])
    assert r1["netns"] == _netns_inode(hosts.namespaces[2])
    # Built from different seeds, equal after the strategy's broadcast; then trained in step.
    for i0, i1, a, b, ref in zip(r0["initial"], r1["initial"], r0["weights"], r1["weights"],
                                 r0["reference"], strict=True):
        np.testing.assert_array_equal(i0, i1)
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
        np.testing.assert_allclose(a, ref, rtol=0, atol=1e-5)  # = one process, global batch
        assert not np.allclose(a, i0), "training did not change the weights"
    assert _nothing_left(hosts) == {}


@pytest.mark.horovod
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_horovod_rank_outlives_the_launcher(hosts, tmp_path, sig):
    pytest.importorskip("horovod.tensorflow")
    script = tmp_path / "sleeper.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(300)\n")
    h1, h2 = hosts.addresses[1], hosts.addresses[2]
    proc = _launch(hosts, tmp_path, "--strategy", "horovod", "--hosts", f"{h1}:1,{h2}:1",
                   "--workers", "2", str(script))
    deadline = time.monotonic() + 40
    while not all(_running(hosts, i, script) for i in (1, 2)):
        assert time.monotonic() < deadline and proc.poll() is None, "remote ranks did not start"
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    assert _nothing_left(hosts) == {}, f"left on the remote hosts after {sig.name}"
    assert not any(_running(hosts, i, script) for i in (1, 2))
