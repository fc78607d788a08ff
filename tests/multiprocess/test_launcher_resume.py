"""--max-restarts: a worker SIGKILLed mid-training; the restarted gang resumes from its backup
and ends with the same weights as a run that was never interrupted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tfdist.testing import RESULT_DIR_ENV

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "resume_train.py"
REPO_ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, name: str, *launcher_args: str, **env: str) -> tuple[str, dict]:
    results = tmp_path / f"{name}-results"
    results.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "tfdist.launcher.cli", "--workers", "2", "--timeout", "240",
         *launcher_args, str(SCRIPT), str(tmp_path / f"{name}-backup")],
        env={**os.environ, **env, RESULT_DIR_ENV: str(results), "MARKER_DIR": str(tmp_path),
             "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reports = {p.stem: json.loads(p.read_text()) for p in results.glob("*.json")}
    return proc.stdout + proc.stderr, reports


def test_killed_worker_gang_restart_matches_an_uninterrupted_run(tmp_path):
    _, plain = _run(tmp_path, "plain")
    log, resumed = _run(tmp_path, "resumed", "--max-restarts", "1", KILL_AFTER_EPOCH="2")

    assert (tmp_path / "killed").exists(), "worker:1 was never killed"
    assert "task worker:1 failed first (exit status -9)" in log
    assert "restarting the whole job (1/1) after exit status 137" in log
    assert plain["worker_0"]["epochs_run"] == [1, 2, 3, 4]
    # The restarted gang ran only the epochs after the backup.
    assert resumed["worker_0"]["epochs_run"] == [3, 4]
    for worker in ("worker_0", "worker_1"):
        for got, want in zip(resumed[worker]["weights"], plain["worker_0"]["weights"],
                             strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
