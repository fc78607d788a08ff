"""Elastic Horovod through ``tfdist-launch --strategy horovod --min-workers 1 --max-workers 2``.

A real job of ``scripts/elastic_train.py`` (``hvd.elastic.run``, 2 ranks; ``TensorFlowKerasState``,
and ``TensorFlowState`` with a plain kill in the last test): once rank 0 has run 2
steps past a commit, rank 1 is SIGKILLed and its slot (whichever address Horovod gave it) removed
from the hosts file tfdist wrote;
after some steps on 1 rank the slot is listed again and a new rank joins. Checked with numbers:

* the sizes the script ran at went 2 -> 1 -> 2, and the steps after the last commit before the
  kill were rolled back (the failure's reset holds the last commit's step);
* the final weights of both ranks are identical and equal, within `ATOL`, a NumPy replay from the
  initial weights of the steps that count (each at the size it ran at: the steps a reset undid
  are dropped), momentum included;
* the launcher exits 0, no process of the job is left, the discovery directory is gone.

The sabotage (``--sabotage``: the state restores the step but not the weights) must miss the
replay by far more than `ATOL`: this shows the check can fail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from tests.horovod.conftest import HOROVOD_IDLE, REPO_ROOT, SCRIPTS
from tests.horovod.scripts.elastic_data import COMMIT_EVERY, LR, MOMENTUM, STEPS, rows
from tfdist.launcher.horovodrun.elastic import write_hosts

pytestmark = [pytest.mark.horovod, pytest.mark.multiprocess, pytest.mark.slow]

ATOL = 1e-5
"""float32 training against a float64 replay of ~130 steps."""
SABOTAGE_GAP = 1e-4
"""10 x `ATOL`: the sabotaged runs measured 1.7e-3 and 2.1e-3."""
SIZE_ONE_STEPS = 8
"""Steps rank 0 runs alone before the killed slot is listed again."""
SLOTS = ["127.0.1.1:1", "127.0.1.2:1"]
LAUNCH_TIMEOUT = 240.0


def _events(out: Path) -> list[dict]:
    path = out / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _wait_for(launcher: subprocess.Popen, out: Path, done, what: str, timeout: float) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = _events(out)
        if done(events):
            return events
        if launcher.poll() is not None:
            pytest.fail(f"tfdist-launch exited ({launcher.returncode}) before {what}")
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}")


def _steps(events: list[dict]) -> list[dict]:
    return [e for e in events if e["event"] == "step"]


def _rank_slot(out: Path, rank: int) -> tuple[int, str]:
    """The pid and host (slot) of ``rank``: Horovod picks which slot gets rank 0."""
    reports = [json.loads(p.read_text()) for p in out.glob("pid-*.json")]
    report = next(r for r in reports if r["rank"] == rank)
    return report["pid"], report["host"]


def replay_chain(events: list[dict]) -> list[tuple[int, int]]:
    """(step, size) of the steps that count: a reset to step s undoes the logged steps >= s."""
    chain: list[tuple[int, int]] = []
    for event in events:
        if event["event"] == "step":
            chain.append((event["step"], event["size"]))
        elif event["event"] == "reset":
            chain = [(step, size) for step, size in chain if step < event["step"]]
    return chain


def replay(init: list, chain: list[tuple[int, int]]) -> list[np.ndarray]:
    """SGD with momentum (Keras's: m = mu m - lr g; w += m) on each step's global batch."""
    kernel, bias = (np.array(w, dtype=np.float64) for w in init)
    moments = [np.zeros_like(kernel), np.zeros_like(bias)]
    for step, size in chain:
        x, y = (np.concatenate(parts).astype(np.float64)
                for parts in zip(*(rows(step, r) for r in range(size)), strict=True))
        error = x @ kernel + bias - y
        scale = 2.0 / error.size  # mean squared error over rows and outputs
        grads = [scale * x.T @ error, scale * error.sum(axis=0)]
        for i, (weight, grad) in enumerate(zip((kernel, bias), grads, strict=True)):
            moments[i] = MOMENTUM * moments[i] - LR * grad
            weight += moments[i]
    return [kernel, bias]


def _job_processes(out: Path) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if any(str(out) in arg for arg in cmdline) and process.pid != os.getpid():
            found.append(process)
    return found


def _run_elastic_job(out: Path, *script_args: str, edit_hosts: bool = True) -> tuple[int, dict]:
    """Runs the job, kills rank 1 after a commit; with ``edit_hosts``, unlists its slot and
    lists it again after some steps on 1 rank (else the slot stays listed and Horovod starts a
    replacement at once: a plain kill). Returns timings."""
    argv = [sys.executable, "-m", "tfdist.launcher.cli", "--strategy", "horovod", "--workers", "2",
            "--min-workers", "1", "--max-workers", "2", "--timeout", str(LAUNCH_TIMEOUT),
            str(SCRIPTS / "elastic_train.py"), str(out), *script_args]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TF_USE_LEGACY_KERAS": "0",
           **HOROVOD_IDLE}
    launcher = subprocess.Popen(argv, env=env, cwd=REPO_ROOT, start_new_session=True)
    try:
        events = _wait_for(launcher, out, lambda ev: any(
            e["step"] >= COMMIT_EVERY and e["step"] % COMMIT_EVERY == 1 for e in _steps(ev)),
            "2 steps past a commit", timeout=150)
        hosts_file = events[0]["hosts_file"]
        pid, host = _rank_slot(out, 1)
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        listed_at = killed_at
        if edit_hosts:
            write_hosts(hosts_file, [slot for slot in SLOTS if not slot.startswith(f"{host}:")])
            events = _wait_for(launcher, out, lambda ev: sum(
                e["size"] == 1 for e in _steps(ev)) >= SIZE_ONE_STEPS, "steps on 1 rank",
                timeout=90)
            listed_at = time.time()
            write_hosts(hosts_file, SLOTS)
        status = launcher.wait(timeout=LAUNCH_TIMEOUT)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    events = _events(out)
    alone = next((e["t"] for e in _steps(events) if e["size"] == 1), killed_at)
    rejoined = next(e["t"] for e in _steps(events) if e["size"] == 2 and e["t"] > listed_at)
    timings = {"hosts_file": hosts_file, "to_one_rank_s": alone - killed_at,
               "to_two_ranks_s": rejoined - listed_at}
    return status, timings


@pytest.mark.parametrize("sabotage", [False, True], ids=["restore", "sabotage"])
def test_killed_rank_job_goes_on_and_rejoins_from_the_last_commit(tmp_path, sabotage):
    if os.geteuid() != 0:
        pytest.skip("elastic jobs need the private network namespace (root: CAP_SYS_ADMIN)")
    out = tmp_path / "out"
    out.mkdir()
    status, timings = _run_elastic_job(out, *(["--sabotage"] if sabotage else []))
    print(f"elastic timings: {timings}")
    assert status == 0
    assert _job_processes(out) == []
    assert not Path(timings["hosts_file"]).parent.exists()

    events = _events(out)
    steps = _steps(events)
    sizes = [s["size"] for i, s in enumerate(steps) if i == 0 or s["size"] != steps[i - 1]["size"]]
    assert sizes == [2, 1, 2]
    failure = next(e for e in events if e["event"] == "reset" and e["size"] == 1)
    last_before = max(s["step"] for s in steps if s["t"] < failure["t"])
    assert failure["step"] % COMMIT_EVERY == 0 and failure["step"] <= last_before
    chain = replay_chain(events)
    assert [step for step, _ in chain] == list(range(STEPS))
    assert len(steps) > len(chain)  # the steps after the last commit were run twice

    gap = _gap_to_replay(out, events, chain)
    print(f"largest difference from the replay: {gap:.3g} (sabotage: {sabotage})")
    if sabotage:
        assert gap > SABOTAGE_GAP
    else:
        assert gap <= ATOL


def _gap_to_replay(out: Path, events: list[dict], chain: list[tuple[int, int]]) -> float:
    """Checks both ranks ended at size 2 with identical weights; their largest difference from
    the replay of ``chain``."""
    finals = [json.loads(p.read_text()) for p in out.glob("final-*.json")]
    assert sorted((f["rank"], f["size"]) for f in finals) == [(0, 2), (1, 2)]
    got = [[np.array(w) for w in f["weights"]] for f in finals]
    for a, b in zip(*got, strict=True):
        np.testing.assert_array_equal(a, b)
    expected = replay(events[0]["init"], chain)
    return max(float(np.max(np.abs(g - e))) for g, e in zip(got[0], expected, strict=True))


def test_a_plain_kill_under_tensorflow_state_is_replaced_and_the_job_finishes(tmp_path):
    # hvd.elastic.TensorFlowState (variables, not a Keras model) and a kill with the slot still
    # listed: Horovod starts a replacement at once. Horovod 0.28.1's TensorFlowState broadcast
    # its variables in its constructor (eagerly), so the replacement waited there alone for
    # ever and the job hung until --timeout (2 of 2 runs); patch 11 broadcasts them in sync().
    if os.geteuid() != 0:
        pytest.skip("elastic jobs need the private network namespace (root: CAP_SYS_ADMIN)")
    out = tmp_path / "out"
    out.mkdir()
    status, timings = _run_elastic_job(out, "--tensorflow-state", edit_hosts=False)
    print(f"elastic timings (plain kill, TensorFlowState): {timings}")
    assert status == 0
    assert _job_processes(out) == []
    events = _events(out)
    assert any(e["event"] == "reset" for e in events)  # the kill was noticed, the job went on
    chain = replay_chain(events)
    assert [step for step, _ in chain] == list(range(STEPS))
    # The replacement starts from its own initial weights: equal ranks and the replay mean it
    # received rank 0's variables when it joined.
    assert _gap_to_replay(out, events, chain) <= ATOL
