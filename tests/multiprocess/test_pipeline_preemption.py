"""SIGTERM to a 2-stage pipeline job mid-epoch: both stages stop at the same step (a vote after
every step), each saves its own stage there, the job exits 75, and the rerun resumes at that step
and ends with the weights of a run that was never interrupted: ``fit`` (Keras 3 here; tf-keras
passes too, run by hand with TF_USE_LEGACY_KERAS=1) and a custom loop over
``strategy.train_step`` with ``strategy.preemption_handler``.

Sabotage, run by hand: with the vote replaced by each process's own note of SIGTERM, the last
stage saves at step 6 and exits alone, stage 0 fails in step 7's transfer ("Socket closed") and
the launcher exits 143: the fit test fails."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from tfdist.testing import RESULT_DIR_ENV, wait_gone

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "pipeline_preempt.py"
CUSTOM_LOOP = Path(__file__).parent / "scripts" / "pipeline_preempt_custom_loop.py"
REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS, TOTAL = 4, 12  # as in the script: 3 epochs of 4 steps
PAUSE_AT = 6  # global step (epoch 2, step 2): the last stage pauses there and gets SIGTERM
# A grace the 2-core machine cannot overrun on a save; a stage left waiting on a transfer (no
# agreement) runs into it and is SIGKILLed.
LAUNCH = [sys.executable, "-m", "tfdist.launcher.cli", "--strategy", "pipeline", "--workers", "2",
          "--stages", "2", "--timeout", "240", "--preemption-grace", "20"]


def _start(tmp_path: Path, name: str, backup: Path, script: Path = SCRIPT,
           **env: str) -> subprocess.Popen[str]:
    results = tmp_path / f"{name}-results"
    results.mkdir()
    return subprocess.Popen(
        [*LAUNCH, str(script), str(backup)],
        env={**os.environ, **env, RESULT_DIR_ENV: str(results), "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(tmp_path: Path, name: str, proc: subprocess.Popen[str]) -> dict:
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    return {p.stem: json.loads(p.read_text())
            for p in (tmp_path / f"{name}-results").glob("*.json")}


def _preempt(tmp_path: Path, backup: Path, script: Path = SCRIPT) -> tuple[str, int]:
    """Runs the job; SIGTERMs the launcher while the last stage pauses after PAUSE_AT steps."""
    proc = _start(tmp_path, "preempted", backup, script, PAUSE_AT_STEP=str(PAUSE_AT))
    lines: list[str] = []
    deadline = time.monotonic() + 200
    while not any(f"paused after step {PAUSE_AT}" in line for line in lines):
        assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
        lines.append(proc.stdout.readline())
    tasks = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert wait_gone(tasks, timeout=10) == [], "a task outlived the preempted launcher"
    return "".join(lines) + out, proc.returncode


def test_sigterm_stops_every_stage_at_one_step_and_the_rerun_ends_like_an_uninterrupted_run(
        tmp_path):
    plain = _finish(tmp_path, "plain", _start(tmp_path, "plain", tmp_path / "plain-backup"))
    assert len(plain["worker_0"]["ran"]) == TOTAL
    # The vote after each step holds no thread (a per-op timeout kept one per step for 300 s).
    assert max(plain[task]["threads_added"] for task in ("worker_0", "worker_1")) < 5, plain

    backup = tmp_path / "backup"
    log, status = _preempt(tmp_path, backup)
    assert status == 75, log
    # The last stage noted SIGTERM before its vote after step PAUSE_AT: the job stops there.
    assert re.search(r"job preempted: every training task saved a checkpoint at the step it was "
                     rf"in and exited with status 75\. worker:0: saved a checkpoint at step "
                     rf"{PAUSE_AT}, in {re.escape(str(backup))}/rank-0\.", log), log
    assert sorted(p.name for p in backup.iterdir()) == ["rank-0", "rank-1"]
    assert "tf-keras" not in log

    resumed = _finish(tmp_path, "resumed", _start(tmp_path, "resumed", backup))
    epoch = PAUSE_AT // STEPS
    # fit starts at the saved epoch; its first PAUSE_AT % STEPS calls run nothing.
    assert resumed["worker_0"]["ran"][0] == [epoch, 0]
    assert len(resumed["worker_0"]["ran"]) == TOTAL - epoch * STEPS
    for task in ("worker_0", "worker_1"):
        assert resumed[task]["iterations"] == plain[task]["iterations"] == TOTAL
    _assert_same_weights(resumed, plain, 6)


def test_a_custom_loop_with_the_pipeline_handler_resumes_at_the_step_it_saved(tmp_path):
    plain = _finish(tmp_path, "plain", _start(tmp_path, "plain", tmp_path / "plain-ckpt",
                                              CUSTOM_LOOP))
    assert plain["worker_0"]["ran"] == list(range(1, TOTAL + 1))

    ckpt = tmp_path / "ckpt"
    log, status = _preempt(tmp_path, ckpt, CUSTOM_LOOP)
    assert status == 75, log
    assert re.search(rf"worker:0: saved a checkpoint at step {PAUSE_AT}, in "
                     rf"{re.escape(str(ckpt))}/rank-0\.", log), log

    resumed = _finish(tmp_path, "resumed", _start(tmp_path, "resumed", ckpt, CUSTOM_LOOP))
    assert resumed["worker_0"]["ran"] == list(range(PAUSE_AT + 1, TOTAL + 1))
    _assert_same_weights(resumed, plain, 4)


def _assert_same_weights(got: dict, want: dict, count: int) -> None:
    trained, reference = got["worker_0"]["weights"], want["worker_0"]["weights"]
    assert len(trained) == len(reference) == count
    for a, b in zip(trained, reference, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
