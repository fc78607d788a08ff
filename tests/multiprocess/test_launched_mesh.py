"""tfdist-launch --stages: every task of a real launch reads its own place on the mesh back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).parent / "scripts" / "mesh_task.py"


def test_each_launched_task_finds_its_coordinates(tmp_path):
    env = {**os.environ, "MARKER_DIR": str(tmp_path)}
    argv = [sys.executable, "-m", "tfdist.launcher.cli", "--strategy", "pipeline", "--stages",
            "2", "--chief", "--workers", "3", str(SCRIPT)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(4)]
    assert [r["task"] for r in records] == [{"type": "chief", "index": 0}] + [
        {"type": "worker", "index": i} for i in range(3)]
    assert {r["shape"] for r in records} == {"data=2,pipe=2,tensor=1"}
    assert [(r["coordinates"]["data"], r["coordinates"]["pipe"]) for r in records] == [
        (0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r["pipe_group"] for r in records] == [[0, 1], [0, 1], [2, 3], [2, 3]]


def test_a_stale_shard_count_in_the_shell_does_not_change_a_launched_tensor_job(tmp_path):
    # Issue 41: `--strategy tensor --workers 2` with TFDIST_TENSOR_SHARDS=1 exported became data
    # parallelism. T now travels in the mesh alone, which the launcher always writes.
    env = {**os.environ, "MARKER_DIR": str(tmp_path), "TFDIST_TENSOR_SHARDS": "1"}
    argv = [sys.executable, "-m", "tfdist.launcher.cli", "--strategy", "tensor", "--workers",
            "2", str(SCRIPT)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    assert {r["shape"] for r in records} == {"data=1,pipe=1,tensor=2"}
    assert [r["coordinates"]["tensor"] for r in records] == [0, 1]
