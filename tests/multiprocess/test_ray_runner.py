"""tfdist-launch --ray on a real local Ray cluster (``ray start --head``), one actor per task.

The cluster (4 logical CPUs) and every launcher run live in one network namespace with only
loopback (`tfdist.launcher.local.netns`), so nothing Ray or the tasks listen on can be reached from
outside; Ray's own servers listen on every interface of the namespace they are in. The cluster
also requires Ray's token authentication; the launcher gets the token by environment. The session
fixture stops the head (``ray start --block`` stops what it started when it gets SIGTERM) and
then kills, by pid, any process of that cluster still alive.

Checked with numbers: multi-worker training, on one node and across two (a second Ray node in a
fake host), ends with the same per-epoch loss as the local launcher's run of the same script
(and identical weights on both workers); a parameter-server job (chief, worker, ps) trains and
its loss falls; Horovod ranks (no ``horovodrun``: the runner serves the Gloo rendezvous) stay
identical and equal to the one-process reference; a task killed with SIGKILL ends the job
naming it; a dead ps worker is restarted alone; an evaluator is a sidecar; ``--max-restarts``
reruns the gang; a gang larger than the cluster fails at once, and one whose CPUs are taken
after ``--ray-gang-timeout``, naming what was asked and what the cluster has. After each run no
task process is left.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from tfdist.launcher.local.netns import NetworkIsolationError, PrivateNetwork
from tfdist.testing import RESULT_DIR_ENV, _collect, wait_gone

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.multiprocess]

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).parent / "scripts"
LAUNCH = [sys.executable, "-m", "tfdist.launcher.cli"]
CLUSTER_CPUS = 4
LOSS_ATOL = 1e-6
"""Ray run against the local run of the same job: the same float32 computation, so equal up to
rounding (measured gap: 0)."""


def _require_ray() -> None:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed: pip install 'tfdist[ray]' (launch/setup.sh does)")


@dataclass
class LocalRay:
    """A running one-node Ray cluster: its head's address, the namespace it lives in, and the
    variables that turn on Ray's token authentication (given to the launcher by environment)."""

    address: str
    network: PrivateNetwork
    auth: dict[str, str]

    def launch(self, results: Path, *argv: str, **env: str) -> subprocess.Popen[str]:
        """``tfdist-launch --ray ADDRESS ARGV`` in the cluster's namespace."""
        environ = {**os.environ, "PYTHONPATH": str(REPO), RESULT_DIR_ENV: str(results),
                   **self.auth, **env}
        return subprocess.Popen(
            [*LAUNCH, "--ray", self.address, "--timeout", "150",
             *[arg for name in env for arg in ("--env", name)], *argv], env=environ, cwd=REPO,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=self.network.join)


def _head_address(head: subprocess.Popen[str], timeout: float) -> str:
    """Reads ``ray start``'s output (on a thread, to the end) until it names its address."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in head.stdout or []],
                     daemon=True).start()
    deadline, seen = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            assert head.poll() is None, f"ray start exited: {''.join(seen)}"
            continue
        seen.append(line)
        if "--address='" in line:
            return line.split("--address='", 1)[1].split("'", 1)[0]
    raise AssertionError(f"ray start named no address within {timeout} s: {''.join(seen)}")


def _stop_nodes(*nodes: subprocess.Popen[Any]) -> None:
    """SIGTERM to each node's ``ray start --block`` at once (each stops its processes: 1.8 s for
    two nodes, 2.6 s one after the other), then SIGKILL, by pid, to anything of them still
    alive."""
    cluster = []
    for node in nodes:
        try:
            cluster += [p.pid for p in psutil.Process(node.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    for node in nodes:
        node.send_signal(signal.SIGTERM)
    for node in nodes:
        try:
            node.wait(timeout=30)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait()
    for pid in wait_gone(cluster, timeout=10):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_gone(cluster, timeout=10)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[LocalRay]:
    _require_ray()
    try:
        network = PrivateNetwork().start()
    except NetworkIsolationError as err:
        pytest.skip(f"the Ray tests keep the cluster on loopback in a network namespace: {err}")
    temp_dir = tempfile.mkdtemp(prefix="tfdray", dir="/tmp")  # short: Ray's socket paths
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    head = subprocess.Popen(
        [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--port", "0",
         "--num-cpus", str(CLUSTER_CPUS), "--temp-dir", temp_dir, "--include-dashboard",
         "false", "--disable-usage-stats"],
        env={**os.environ, "PYTHONPATH": str(REPO), **auth}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, preexec_fn=network.join, start_new_session=True)
    try:
        yield LocalRay(_head_address(head, timeout=120), network, auth)
    finally:
        _stop_nodes(head)
        network.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _running(script: Path, results: Path) -> list[int]:
    """Processes whose command line names ``script``, of the job whose TFDIST_RESULT_DIR is
    ``results`` (another job running the same script, under pytest -n 2 in another module, is
    not this job's; a process whose environment cannot be read counts as this job's)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if str(script) not in (proc.info["cmdline"] or []):
            continue
        try:
            result_dir = proc.environ().get(RESULT_DIR_ENV)
        except psutil.Error:
            result_dir = None
        if result_dir in (None, str(results)):
            found.append(proc.info["pid"])
    return found


def _read_until(proc: subprocess.Popen[str], text: str) -> str:
    """``proc``'s output up to the first line holding ``text`` (the launcher's own deadlines
    bound the wait); the rest is left for `_finish`."""
    seen = ""
    for line in proc.stdout or []:
        seen += line
        if text in line:
            return seen
    raise AssertionError(f"the launcher ended without printing {text!r}: {seen}")


def _finish(proc: subprocess.Popen[str], timeout: float = 200) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


PARITY_SCRIPT = SCRIPTS / "ray_parity_train.py"


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], dict[str, Any]]]:
    """The parity script's results under the local launcher (2 workers, this machine), as a
    call: the run starts when the fixture is set up and is waited for at the first call, so it
    trains while a Ray cluster starts (a test names this fixture before its cluster's)."""
    _require_ray()
    results = tmp_path_factory.mktemp("local_run")
    log = results / "launcher.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), RESULT_DIR_ENV: str(results)}
    with log.open("w") as out:
        local = subprocess.Popen([*LAUNCH, "--workers", "2", "--timeout", "150",
                                  str(PARITY_SCRIPT)], env=env, cwd=REPO, stdout=out,
                                 stderr=subprocess.STDOUT)

    @functools.cache
    def finished() -> dict[str, Any]:
        assert local.wait(timeout=200) == 0, log.read_text()
        return _collect(results)

    try:
        yield finished
    finally:
        if local.poll() is None:  # no test read it (they were skipped): stop it and its tasks
            local.send_signal(signal.SIGINT)
            try:
                local.wait(timeout=60)
            except subprocess.TimeoutExpired:
                local.kill()
                local.wait()


def _assert_same_training(on_ray: dict[str, Any], local: dict[str, Any]) -> None:
    assert on_ray["worker:0"]["num_workers"] == 2
    loss, local_loss = on_ray["worker:0"]["loss"], local["worker:0"]["loss"]
    print(f"per-epoch loss on Ray {loss}, local launcher {local_loss}")
    assert len(loss) == 2 and loss[-1] < loss[0], loss
    np.testing.assert_allclose(loss, local_loss, rtol=0, atol=LOSS_ATOL)
    for a, b in zip(on_ray["worker:0"]["weights"], on_ray["worker:1"]["weights"], strict=True):
        np.testing.assert_array_equal(a, b)


def test_multi_worker_trains_to_the_local_runs_loss(local_run, ray_cluster, tmp_path):
    proc = ray_cluster.launch(tmp_path, "--workers", "2", str(PARITY_SCRIPT))
    out = _finish(proc)
    assert proc.returncode == 0, out
    assert "gang of 2 task(s) placed (SPREAD, 1 CPU each)" in out
    assert "task worker:1 on 127.0.0.1 (port " in out
    assert _running(PARITY_SCRIPT, tmp_path) == []
    on_ray = _collect(tmp_path)
    assert not on_ray["worker:0"]["ray_token"], "a task must not get the cluster's token"
    _assert_same_training(on_ray, local_run())


def test_parameter_server_with_chief_and_ps_trains(ray_cluster, tmp_path):
    proc = ray_cluster.launch(tmp_path, "--ps", "1", "--workers", "1",
                              str(SCRIPTS / "ps_train.py"), "0")
    out = _finish(proc)
    assert proc.returncode == 0, out
    for task in ("chief:0", "worker:0", "ps:0"):
        assert f"task {task} on 127.0.0.1" in out
    chief = _collect(tmp_path)["chief:0"]
    assert chief["num_workers"] == 1
    assert chief["loss"][-1] < 0.8 * chief["loss"][0], chief["loss"]
    assert sum(map(sum, chief["seen"])) == 30, "every step ran on the worker"
    assert _running(SCRIPTS / "ps_train.py", tmp_path) == []


@pytest.mark.horovod
def test_horovod_ranks_stay_identical_and_match_the_reference(ray_cluster, tmp_path):
    pytest.importorskip("horovod.tensorflow")
    script = SCRIPTS / "multihost_horovod_train.py"
    proc = ray_cluster.launch(tmp_path, "--strategy", "horovod", "--workers", "2", str(script))
    out = _finish(proc)
    assert proc.returncode == 0, out
    results = _collect(tmp_path)
    assert set(results) == {"rank:0", "rank:1"}, out
    r0, r1 = results["rank:0"], results["rank:1"]
    assert r0["size"] == r1["size"] == 2
    assert r0["tf_config"] is None and r1["tf_config"] is None
    for i0, i1, a, b, ref in zip(r0["initial"], r1["initial"], r0["weights"], r1["weights"],
                                 r0["reference"], strict=True):
        np.testing.assert_array_equal(i0, i1)  # different seeds, equal after the broadcast
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
        np.testing.assert_allclose(a, ref, rtol=0, atol=1e-5)  # = one process, global batch
        assert not np.allclose(a, i0), "training did not change the weights"
    assert _running(script, tmp_path) == []


def _task_pids(marker_dir: Path, task: str) -> list[int]:
    return [int(p.name.rsplit(".", 1)[1]) for p in marker_dir.glob(f"{task}.pid.*")]


def test_a_killed_task_ends_the_job_naming_it(ray_cluster, tmp_path):
    script = SCRIPTS / "launcher_task.py"
    proc = ray_cluster.launch(tmp_path, "--workers", "2", "--chief", str(script),
                              LAUNCHER_TEST_MODE="sleep", MARKER_DIR=str(tmp_path))
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("*.pid.*"))) < 3:
        assert time.monotonic() < deadline and proc.poll() is None, "tasks did not start"
        time.sleep(0.1)
    started = time.monotonic()
    os.kill(_task_pids(tmp_path, "worker:1")[0], signal.SIGKILL)
    out = _finish(proc, timeout=60)
    assert proc.returncode == 137, out
    assert "task worker:1 failed first (exit status -9); every task stopped" in out
    assert "[chief:0] task chief:0 mode sleep" in out  # each task's output, prefixed
    assert time.monotonic() - started < 20, "the job did not end soon after the kill"
    pids = [int(p.name.rsplit(".", 1)[1]) for p in tmp_path.glob("*.pid.*")]
    assert wait_gone(pids, timeout=10) == [] and _running(script, tmp_path) == []


def test_a_launcher_without_the_clusters_token_is_refused(ray_cluster, tmp_path):
    # Ray retries with a refused token for about 20 s before it gives up; the deadline (2 s,
    # several times the 0.3 s a launcher with the token takes to connect) ends that first, with
    # the same message
    proc = ray_cluster.launch(tmp_path, "--workers", "2", "--ray-gang-timeout", "2",
                              str(SCRIPTS / "launcher_task.py"), RAY_AUTH_TOKEN="0" * 64)
    out = _finish(proc, timeout=90)
    assert proc.returncode == 1, out
    assert f"Cannot reach the Ray cluster at --ray {ray_cluster.address}" in out
    assert "also needs its token in RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH" in out
    assert "task " not in out.split("Cannot reach", 1)[0], "nothing may start"


def test_max_restarts_reruns_the_gang(ray_cluster, tmp_path):
    proc = ray_cluster.launch(tmp_path, "--workers", "2", "--max-restarts", "1",
                              str(SCRIPTS / "launcher_task.py"),
                              LAUNCHER_TEST_MODE="fail_once", MARKER_DIR=str(tmp_path))
    out = _finish(proc, timeout=120)
    assert proc.returncode == 0, out
    assert "task worker:1 failed first (exit status 5)" in out
    assert "restarting the whole job (1/1) after exit status 5" in out
    assert len(_task_pids(tmp_path, "worker:1")) == 2


def test_a_gang_larger_than_the_cluster_fails_at_once_naming_the_resources(ray_cluster,
                                                                           tmp_path):
    started = time.monotonic()
    proc = ray_cluster.launch(tmp_path, "--workers", str(CLUSTER_CPUS + 1),
                              str(SCRIPTS / "launcher_task.py"), MARKER_DIR=str(tmp_path))
    out = _finish(proc, timeout=60)
    assert proc.returncode == 1, out
    assert "cannot hold the job's 5 task(s) at once (the whole cluster has fewer CPUs)" in out
    assert "Asked: 5 bundle(s) of {CPU: 1} = 5 CPU, placement SPREAD" in out
    assert "Cluster: 4 CPU on 1 node(s) (largest node 4 CPU), 4 CPU free now" in out
    assert "Fix: fewer tasks (--workers, --ps)" in out
    assert list(tmp_path.glob("*.pid.*")) == [], "no task may start"
    assert time.monotonic() - started < 30


def test_a_gang_that_finds_its_resources_taken_waits_then_fails(ray_cluster, tmp_path):
    """3 of the 4 CPUs held by a running job: a 2-task gang waits --ray-gang-timeout, then
    fails naming what is free, and the running job is not disturbed.

    The second gang is asked for once the first holds its CPUs (its placement group is ready),
    while the first's tasks start: 1.4 s sooner than once they have started."""
    script = SCRIPTS / "launcher_task.py"
    busy = ray_cluster.launch(tmp_path, "--workers", "3", str(script),
                              LAUNCHER_TEST_MODE="sleep", MARKER_DIR=str(tmp_path))
    try:
        _read_until(busy, "gang of 3 task(s) placed")
        started = time.monotonic()
        proc = ray_cluster.launch(tmp_path / "second", "--workers", "2", "--ray-gang-timeout",
                                  "3", str(script))
        out = _finish(proc, timeout=60)
        assert proc.returncode == 1, out
        assert "(its resources were not free within 3 s)" in out
        assert "Cluster: 4 CPU on 1 node(s) (largest node 4 CPU), 1 CPU free now" in out
        assert time.monotonic() - started < 30
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("*.pid.*"))) < 3:
            assert time.monotonic() < deadline and busy.poll() is None, "tasks did not start"
            time.sleep(0.1)
        assert busy.poll() is None, "the running job was disturbed"
    finally:
        busy.send_signal(signal.SIGINT)
        _finish(busy, timeout=60)
    pids = [int(p.name.rsplit(".", 1)[1]) for p in tmp_path.glob("*.pid.*")]
    assert wait_gone(pids, timeout=10) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_task_outlives_the_launcher(ray_cluster, tmp_path, sig):
    """SIGTERM: forwarded to the tasks, which did not save (143); SIGKILL: Ray kills the dead
    driver's actors, and each task dies with its actor."""
    proc = ray_cluster.launch(tmp_path, "--workers", "2", str(SCRIPTS / "launcher_task.py"),
                              LAUNCHER_TEST_MODE="sleep", MARKER_DIR=str(tmp_path))
    deadline = time.monotonic() + 60
    while len(pids := [int(p.name.rsplit(".", 1)[1]) for p in tmp_path.glob("*.pid.*")]) < 2:
        assert time.monotonic() < deadline and proc.poll() is None, "tasks did not start"
        time.sleep(0.1)
    proc.send_signal(sig)
    out = _finish(proc, timeout=60)
    assert wait_gone(pids, timeout=30) == [], f"left behind after {sig.name}: {out}"
    if sig == signal.SIGTERM:
        assert proc.returncode == 143, out
        assert "job stopped by SIGTERM" in out
        assert "[worker:0] task worker:0 mode sleep" in out  # output until the very end


def _wait_for_nodes(python: list[str], address: str, count: int, env: dict[str, str]) -> None:
    """Waits (bounded) until ``count`` nodes have joined the cluster at ``address``."""
    probe = (f"import ray, time\nray.init(address={address!r}, logging_level='ERROR')\n"
             "deadline = time.monotonic() + 60\n"
             f"while len([n for n in ray.nodes() if n['Alive']]) < {count}:\n"
             "    assert time.monotonic() < deadline, ray.nodes()\n    time.sleep(0.1)\n")
    done = subprocess.run([*python, "-c", probe], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"{count} Ray nodes did not join: {done.stdout}{done.stderr}"


@pytest.fixture(scope="module")
def two_nodes(
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any, dict[str, str]]]:
    """A Ray head and a second Ray node, each in its own fake host (network namespace on a
    private bridge, `fake_hosts`), with token authentication; yields the head's address, the
    hosts and the token's environment."""
    sys.path.insert(0, str(Path(__file__).parent))
    from fake_hosts import FakeHosts, missing_requirement

    reason = missing_requirement()
    if reason or importlib.util.find_spec("ray") is None:
        pytest.skip(f"two-node Ray test: {reason or 'ray is not installed'}")
    tmp = Path(tempfile.mkdtemp(prefix="tfdray2", dir="/tmp"))
    hosts = FakeHosts.start(tmp, count=2, sshd_on=(), label="ray")
    ray_bin, nodes = str(Path(sys.executable).parent / "ray"), []
    # The auth mode is explicit: with RAY_AUTH_MODE unset, Ray turns token auth on for a head
    # when ~/.ray/auth_token exists (any earlier local ray.init() writes one), and the second
    # node is then refused ("InvalidAuthToken").
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    env = {**os.environ, "PYTHONPATH": str(REPO), **auth}
    common = ["--block", "--num-cpus", "2", "--disable-usage-stats"]
    try:
        nodes.append(subprocess.Popen(hosts.exec_argv(0, [
            ray_bin, "start", "--head", "--port", "0", "--node-ip-address", hosts.addresses[0],
            "--temp-dir", str(tmp / "ray"), "--include-dashboard", "false", *common]), env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True))
        address = _head_address(nodes[0], timeout=120)
        nodes.append(subprocess.Popen(hosts.exec_argv(1, [
            ray_bin, "start", "--address", address, "--node-ip-address", hosts.addresses[1],
            *common]), env=env, stdout=(tmp / "node1.log").open("w"),
            stderr=subprocess.STDOUT, start_new_session=True))
        try:
            _wait_for_nodes(hosts.exec_argv(0, [sys.executable]), address, 2, env)
        except AssertionError as err:
            raise AssertionError(f"{err}\nthe second node's output:\n"
                                 f"{(tmp / 'node1.log').read_text()}") from None
        yield address, hosts, auth
    finally:
        _stop_nodes(*nodes)
        hosts.close()  # also kills anything left in the namespaces
        shutil.rmtree(tmp, ignore_errors=True)


def test_multi_worker_across_two_ray_nodes_trains_to_the_local_runs_loss(
        local_run, two_nodes, tmp_path):
    address, hosts, auth = two_nodes
    env = {**os.environ, "PYTHONPATH": str(REPO), RESULT_DIR_ENV: str(tmp_path), **auth}
    # 2 CPUs per task on nodes of 2 CPUs: one task on each node.
    proc = subprocess.run(hosts.exec_argv(0, [
        *LAUNCH, "--ray", address, "--timeout", "150", "--workers", "2", "--ray-cpus-per-task",
        "2", str(PARITY_SCRIPT)]), env=env, cwd=REPO, capture_output=True, text=True,
        timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for node in hosts.addresses:
        assert f" on {node} (port " in out, out
    on_ray = _collect(tmp_path)
    namespaces = {on_ray[t]["netns"] for t in ("worker:0", "worker:1")}
    assert namespaces == {os.stat(f"/run/netns/{ns}").st_ino for ns in hosts.namespaces}
    _assert_same_training(on_ray, local_run())


def _server_of(role: str, results: Path) -> list[int]:
    """The ``tfdist.server`` processes of this job's ``role`` tasks (told apart by the
    TFDIST_RESULT_DIR the launcher forwards)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if "tfdist.server" not in (proc.info["cmdline"] or []):
            continue
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        if (env.get(RESULT_DIR_ENV) == str(results)
                and f'"type": "{role}"' in env.get("TF_CONFIG", "")):
            found.append(proc.info["pid"])
    return found


def test_a_dead_parameter_server_worker_is_restarted_alone(ray_cluster, tmp_path):
    proc = ray_cluster.launch(tmp_path, "--ps", "1", "--workers", "1",
                              str(SCRIPTS / "launcher_task.py"),
                              LAUNCHER_TEST_MODE="sleep", MARKER_DIR=str(tmp_path))
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout or []],
                     daemon=True).start()
    try:
        deadline = time.monotonic() + 60
        while not (workers := _server_of("worker", tmp_path)):
            assert time.monotonic() < deadline and proc.poll() is None, "no worker server"
            time.sleep(0.2)
        os.kill(workers[0], signal.SIGKILL)
        seen = ""
        while "worker:0 restarted (pid" not in seen:
            assert time.monotonic() < deadline + 30 and proc.poll() is None, seen
            try:
                seen += lines.get(timeout=1)
            except queue.Empty:
                pass
        assert "[tfdist] worker:0 exited with status -9; restarting it alone (1/3)" in seen
        assert proc.poll() is None, "the job must go on"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert _server_of("worker", tmp_path) == _server_of("ps", tmp_path) == []


def test_an_evaluator_is_a_sidecar(ray_cluster, tmp_path):
    proc = ray_cluster.launch(tmp_path, "--workers", "2", "--evaluator",
                              str(SCRIPTS / "launcher_task.py"),
                              LAUNCHER_TEST_MODE="fail_evaluator", MARKER_DIR=str(tmp_path),
                              TFDIST_LAUNCH_VERBOSE="0")  # the default view (tests run verbose)
    out = _finish(proc, timeout=120)
    assert proc.returncode == 0, out
    assert "[tfdist] sidecar evaluator:0 exited with status 4; job goes on" in out
    assert "[worker:0] worker:0 trained" in out and "[worker:1]" not in out  # the default view
    assert "output of worker:1 hidden unless it fails (--verbose shows it)" in out
    assert ": 3 tasks succeeded" in out and "job finished in " in out


@pytest.mark.parametrize("listener", ["refused", "silent"])
def test_an_address_where_no_ray_answers_fails_within_the_deadline(listener, tmp_path):
    # Ray's own ray.init waits for ever (420 s seen) on a port where nothing answers: the
    # launcher names the address within --ray-gang-timeout.
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed")
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    if listener == "silent":
        server.listen()  # accepts connections and never speaks
    else:
        server.close()  # nothing listens: refused
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    started = time.monotonic()
    try:
        done = subprocess.run([*LAUNCH, "--ray", f"127.0.0.1:{port}", "--ray-gang-timeout", "2",
                               "--workers", "2", str(script)], env={**os.environ,
                              "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                              timeout=90)
    finally:
        server.close()
    took = time.monotonic() - started
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"Cannot reach the Ray cluster at --ray 127.0.0.1:{port} within 2 s" in done.stderr
    assert "never runs" not in done.stdout
    assert took < 2 + 15, took  # the deadline, plus importing ray and exiting
