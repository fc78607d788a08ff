"""``tfdist-launch --export slurm`` scripts submitted with ``sbatch`` to a real Slurm cluster.

The cluster (`slurm_cluster.SlurmCluster`) is private to the module: munged, slurmctld on fake
host 0 and one slurmd on each of fake hosts 1 and 2 (network namespaces, nodes named by their
addresses), all stopped at the end. Each job is the exported script, unchanged, submitted with
``sbatch`` and waited for; the tasks report through ``TFDIST_RESULT_DIR`` (the hosts share this
filesystem). Synchronous jobs are compared with a local run of the same script and seed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tfdist.launcher.export.documents import export_job
from tfdist.launcher.plan import JobOptions, plan_job
from tfdist.testing import RESULT_DIR_ENV, _collect

sys.path.insert(0, str(Path(__file__).parents[1] / "multiprocess"))
sys.path.insert(0, str(Path(__file__).parent))
from slurm_cluster import SlurmCluster, missing_requirement  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "slurm_train.py"
LIBS = Path(__file__).parents[1] / "multiprocess" / "scripts"  # parity_lib
JOB_TIMEOUT = 150
# Same data, same seed, same global batches, plain SGD: only float summation order differs.
LOSS_RTOL, WEIGHTS_ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = missing_requirement()
    if reason:
        pytest.skip(f"Slurm test {reason}")
    cluster = SlurmCluster.start(tmp_path_factory.mktemp("slurm"), nodes=2)
    try:
        yield cluster
    finally:
        cluster.close()


def _job_env(results: Path) -> dict[str, str]:
    return {RESULT_DIR_ENV: str(results), "PYTHONPATH": f"{REPO_ROOT}:{LIBS}",
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The script run alone (default strategy, no Slurm) with the same seed and batches."""
    results = tmp_path_factory.mktemp("local")
    env = {**os.environ, **_job_env(results)}
    env.pop("TFDIST_STRATEGY", None)
    done = subprocess.run([sys.executable, str(SCRIPT), "2"], env=env, cwd=results,
                          capture_output=True, text=True, timeout=JOB_TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    return _collect(results)["chief:0"]


def _submit(slurm: SlurmCluster, tmp: Path, options: JobOptions, *sbatch: str,
            prelude: str = "") -> tuple[int, str, dict]:
    """Exports ``options`` for 2 nodes, submits it and waits for its end (`SlurmCluster.run_batch`);
    (status, log, results)."""
    script = export_job(plan_job(options), "slurm", nodes=2, python=sys.executable)
    if prelude:  # a test's own step, run before the job's
        script = script.replace("set -euo pipefail\n", f"set -euo pipefail\n{prelude}\n")
    (tmp / "job.sbatch").write_text(script)
    results = tmp / "results"
    results.mkdir()
    env = {**slurm.env, **_job_env(results)}
    log = tmp / "job.log"
    done = slurm.run_batch([f"--output={log}", *sbatch, str(tmp / "job.sbatch")], JOB_TIMEOUT,
                           cwd=tmp, env=env)
    return done.returncode, log.read_text(errors="replace") + done.stderr, _collect(results)


def _nothing_left(slurm: SlurmCluster, timeout: float = 15) -> dict[int, list[int]]:
    """Waits until the nodes run nothing but their slurmd; returns what is left."""
    assert slurm.hosts is not None
    daemons = {proc.pid for proc in slurm.daemons}
    deadline = time.monotonic() + timeout
    while True:
        left = {i: [p for p in slurm.hosts.pids(i) if p not in daemons] for i in (1, 2)}
        left = {i: pids for i, pids in left.items() if pids}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _assert_like_local(results: dict, local: dict, names: list[str]) -> None:
    assert sorted(results) == sorted(names), results.keys()
    for name in names:
        got = results[name]
        assert got["replicas"] == 2
        assert got["final_loss"] < 0.2 * got["first_loss"], f"{name}: loss did not fall"
        np.testing.assert_allclose(got["final_loss"], local["final_loss"], rtol=LOSS_RTOL)
        for a, b in zip(got["weights"], local["weights"], strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=WEIGHTS_ATOL)
    first, second = (results[name]["weights"] for name in names)
    for a, b in zip(first, second, strict=True):  # replicas identical
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def _netns(slurm: SlurmCluster, host: int) -> int:
    assert slurm.hosts is not None
    return os.stat(f"/run/netns/{slurm.hosts.namespaces[host]}").st_ino


def test_multi_worker_job_trains_like_the_local_run_one_worker_per_node(
    slurm: SlurmCluster, local_run: dict, tmp_path: Path
) -> None:
    status, log, results = _submit(slurm, tmp_path, JobOptions(str(SCRIPT), ("2",), workers=2))
    assert status == 0, log
    _assert_like_local(results, local_run, ["worker:0", "worker:1"])
    # One worker per node, each in its node's namespace.
    assert {results[n]["node"] for n in results} == set(slurm.nodes)
    for name in results:
        host = slurm.nodes.index(results[name]["node"]) + 1
        assert results[name]["netns"] == _netns(slurm, host)
    assert _nothing_left(slurm) == {}


@pytest.mark.horovod
def test_horovod_job_over_srun_trains_like_the_local_run(
    slurm: SlurmCluster, local_run: dict, tmp_path: Path
) -> None:
    pytest.importorskip("horovod.tensorflow")
    options = JobOptions(str(SCRIPT), ("2",), strategy="horovod", workers=2)
    status, log, results = _submit(slurm, tmp_path, options)
    assert status == 0, log
    _assert_like_local(results, local_run, ["rank:0", "rank:1"])
    assert {results[n]["node"] for n in results} == set(slurm.nodes)
    assert _nothing_left(slurm) == {}


# --overlap: the job's own step, next, may start on these CPUs at once. Without it, that step
# found them still held by this one, ended seconds before, and srun waited for slurmctld's word
# that they were free, which does not reach it across the fake hosts' namespaces: it retried
# after its 60-70 s step wait, twice (CI: 132 s for the test, the step 3 s).
_PLACES = (
    "srun --overlap --label sh -c 'echo \"@$SLURMD_NODENAME $({python} -m "
    "tfdist.launcher.slurm.task --strategy parameter_server --ps 1 --chief --dry-run -- x)\"'"
)


def test_parameter_server_job_under_cyclic_distribution_places_every_task_on_its_node(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """4 tasks on 2 nodes: block puts ranks 0-1 on the first node, cyclic ranks 0 and 2."""
    options = JobOptions(str(SCRIPT), ("2",), workers=2, ps=1)
    status, log, results = _submit(slurm, tmp_path, options, "--distribution=cyclic",
                                   prelude=_PLACES.format(python=sys.executable))
    assert status == 0, log
    places = {}
    for line in log.splitlines():
        rank, _, rest = line.partition(": @")
        if rest:
            node, plan = rest.split(" ", 1)
            places[int(rank)] = (node, json.loads(plan))
    first, second = slurm.nodes
    assert [places[r][0] for r in range(4)] == [first, second, first, second], "not cyclic"
    tasks = set()
    for node, plan in places.values():  # every task's own address is on the node it runs on
        kind, index = plan["task"].split(":")
        assert plan["tf_config"]["cluster"][kind][int(index)].split(":")[0] == node
        tasks.add(plan["task"])
    assert tasks == {"chief:0", "worker:0", "worker:1", "ps:0"}
    chief = results["chief:0"]
    assert chief["final_loss"] < 0.5 * chief["first_loss"], chief
    assert _nothing_left(slurm) == {}


def test_a_killed_task_ends_the_job_naming_it(slurm: SlurmCluster, tmp_path: Path) -> None:
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\nprint('up', flush=True)\ntime.sleep(300)\n")
    assert slurm.hosts is not None
    script = export_job(plan_job(JobOptions(str(sleeper), workers=2)), "slurm", nodes=2,
                        python=sys.executable)
    (tmp_path / "job.sbatch").write_text(script)
    log = tmp_path / "job.log"
    submitted = slurm.client(["sbatch", "--parsable", f"--output={log}",
                              str(tmp_path / "job.sbatch")], cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    try:
        victim = _wait_for_script(slurm, 2, sleeper)
        os.kill(victim, signal.SIGKILL)
        status = slurm.wait_job(job, timeout=60)
    finally:
        slurm.client(["scancel", job])  # a no-op once it has ended
    text = log.read_text(errors="replace")
    assert status != 0, text
    second = slurm.nodes[1]
    assert f"[tfdist] task worker:1 (Slurm rank 1 on node {second}) was killed by SIGKILL" in text
    assert _nothing_left(slurm) == {}


def _wait_for_script(slurm: SlurmCluster, host: int, script: Path, timeout: float = 60) -> int:
    """The pid of the process running ``script`` on fake host ``host``, once it is up."""
    assert slurm.hosts is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in slurm.hosts.pids(host):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            if str(script) in argv and "tfdist.launcher.slurm.task" not in argv:
                return pid
        time.sleep(0.2)
    raise AssertionError(f"{script.name} did not start on host {host}")
