"""A model-parallel job whose last process is SIGKILLed in epoch 2 is restarted by
--max-restarts, resumes every process from its own backup and ends with the weights of a job that
was never interrupted: a pipeline (--chief + 1 worker: 2 stages; chief:0 and worker:0 back up to
different directories) and a tensor-parallel job (2 shards, each with its own shard's weights and
Adam slots)."""

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

SCRIPT = Path(__file__).parent / "scripts" / "pipeline_resume.py"
REPO = Path(__file__).resolve().parents[2]
PIPELINE = ("--strategy", "pipeline", "--chief", "--workers", "1", "--stages", "2")
TENSOR = ("--strategy", "tensor", "--workers", "2", "--tensor", "2")


def run_job(tmp_path: Path, name: str, flavour: str, *launcher_args: str,
            topology: tuple[str, ...] = PIPELINE, **env: str) -> tuple[str, dict]:
    results = tmp_path / f"{name}-results"
    results.mkdir()
    if flavour == "tf_keras":
        env["TF_USE_LEGACY_KERAS"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "tfdist.launcher.cli", *topology, "--timeout", "240",
         *launcher_args, str(SCRIPT),
         str(tmp_path / f"{name}-backup")],
        env={**os.environ, **env, RESULT_DIR_ENV: str(results), "MARKER_DIR": str(tmp_path),
             "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    reports = {p.stem: json.loads(p.read_text()) for p in results.glob("*.json")}
    return done.stdout + done.stderr, reports


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_a_killed_stage_resumes_from_per_rank_backups_like_an_uninterrupted_run(
        tmp_path, flavour):
    _, plain = run_job(tmp_path, "plain", flavour)
    log, resumed = run_job(tmp_path, "resumed", flavour, "--max-restarts", "1", KILL_IN_EPOCH="2")

    assert (tmp_path / "killed").exists(), "the last stage was never killed"
    assert "restarting the whole job (1/1)" in log
    assert plain["chief_0"]["epochs_run"] == [1, 2, 3]
    # Each stage restored epoch 1 from its own backup and ran only epochs 2 and 3.
    assert resumed["chief_0"]["epochs_run"] == resumed["worker_0"]["epochs_run"] == [2, 3]
    backups = {task: Path(r["backup_dir"]) for task, r in resumed.items()}
    assert backups["chief_0"].name == "rank-0" and backups["worker_0"].name == "rank-1"
    assert backups["chief_0"].parent == backups["worker_0"].parent
    assert [resumed[t]["rank"] for t in ("chief_0", "worker_0")] == [0, 1]
    trained, reference = resumed["chief_0"]["weights"], plain["chief_0"]["weights"]
    assert len(trained) == len(reference) == 6
    for got, want in zip(trained, reference, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_a_killed_tensor_shard_resumes_from_per_rank_backups_like_an_uninterrupted_run(tmp_path):
    _, plain = run_job(tmp_path, "plain", "keras3", topology=TENSOR)
    log, resumed = run_job(tmp_path, "resumed", "keras3", "--max-restarts", "1",
                           topology=TENSOR, KILL_IN_EPOCH="2")

    assert (tmp_path / "killed").exists(), "the last shard was never killed"
    assert "restarting the whole job (1/1)" in log
    assert plain["worker_0"]["epochs_run"] == [1, 2, 3]
    assert resumed["worker_0"]["epochs_run"] == resumed["worker_1"]["epochs_run"] == [2, 3]
    backups = {task: Path(r["backup_dir"]) for task, r in resumed.items()}
    assert [backups[t].name for t in ("worker_0", "worker_1")] == ["rank-0", "rank-1"]
    trained, reference = resumed["worker_0"]["weights"], plain["worker_0"]["weights"]
    assert len(trained) == len(reference) == 6
    for got, want in zip(trained, reference, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
