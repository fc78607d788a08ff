"""SIGTERM to a 2-shard tensor job mid-epoch: both shards stop at the same step (the pipeline's
vote after every step), each saves its own shards there, the job exits 75, and the rerun resumes
at that step and ends with the weights of one process trained without interruption (Adam,
1e-5). It once trained on through ``--preemption-grace`` and was killed (exit 143). Two
launches of 2 processes (slow)."""

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
import pytest

from tfdist.testing import RESULT_DIR_ENV

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "tensor_preempt.py"
REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS, TOTAL, PAUSE_AT = 4, 12, 6
PARITY_ATOL = 1e-5
"""float32 shards against the whole model in one process."""
LAUNCH = [sys.executable, "-m", "tfdist.launcher.cli", "--strategy", "tensor", "--workers", "2",
          "--timeout", "240", "--preemption-grace", "20"]


def _start(tmp_path: Path, name: str, backup: Path, **env: str) -> subprocess.Popen[str]:
    results = tmp_path / f"{name}-results"
    results.mkdir()
    return subprocess.Popen(
        [*LAUNCH, str(SCRIPT), str(backup)],
        env={**os.environ, **env, RESULT_DIR_ENV: str(results), "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(tmp_path: Path, name: str, proc: subprocess.Popen[str]) -> dict:
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    return {p.stem: json.loads(p.read_text())
            for p in (tmp_path / f"{name}-results").glob("*.json")}


def test_sigterm_stops_every_shard_at_one_step_and_the_rerun_ends_like_an_uninterrupted_run(
        tmp_path):
    backup = tmp_path / "backup"
    proc = _start(tmp_path, "preempted", backup, PAUSE_AT_STEP=str(PAUSE_AT))
    lines: list[str] = []
    deadline = time.monotonic() + 200
    while not any(f"paused after step {PAUSE_AT}" in line for line in lines):
        assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
        lines.append(proc.stdout.readline())
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    log = "".join(lines) + out
    assert proc.returncode == 75, log
    assert re.search(r"job preempted: every training task saved a checkpoint at the step it was "
                     rf"in and exited with status 75\. worker:0: saved a checkpoint at step "
                     rf"{PAUSE_AT}, in {re.escape(str(backup))}/rank-0\.", log), log

    resumed = _finish(tmp_path, "resumed", _start(tmp_path, "resumed", backup, REFERENCE="1"))
    epoch = PAUSE_AT // STEPS
    # fit starts at the saved epoch; its first PAUSE_AT % STEPS calls run nothing.
    assert resumed["worker_0"]["ran"][0] == [epoch, 0]
    assert len(resumed["worker_0"]["ran"]) == TOTAL - epoch * STEPS
    for task in ("worker_0", "worker_1"):
        assert resumed[task]["iterations"] == TOTAL
    trained, reference = resumed["worker_0"]["weights"], resumed["worker_0"]["reference"]
    assert len(trained) == len(reference) == 6
    for a, b in zip(trained, reference, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=PARITY_ATOL)
