"""A Horovod script under another strategy's launch stops with the fix instead of training alone.

``tfdist-launch --strategy multi_worker --workers 2`` gives each process a TF_CONFIG of 2 tasks
but no Horovod ranks, so Horovod would run each as a job of one. The control: the same script
under ``--strategy horovod`` reports 2 ranks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.horovod.conftest import REPO_ROOT, SCRIPTS

pytestmark = [pytest.mark.horovod, pytest.mark.multiprocess, pytest.mark.slow]  # ~55 s loaded


def _launch(tmp_path, strategy: str) -> subprocess.CompletedProcess:
    tmp_path.mkdir()
    python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": python_path, "TF_CPP_MIN_LOG_LEVEL": "3",
           "TFDIST_RESULT_DIR": str(tmp_path)}
    command = [sys.executable, "-m", "tfdist.launcher.cli", "--timeout", "120", "--strategy",
               strategy, "--workers", "2", "--verbose", str(SCRIPTS / "no_ranks.py")]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=180)


def test_horovod_script_under_multi_worker_launch_is_refused(tmp_path):
    proc = _launch(tmp_path / "mw", "multi_worker")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    assert "StrategyConfigError: Horovod has no ranks" in output
    assert "Received: TF_CONFIG with 2 tasks (this one worker:" in output
    assert "Fix: launch with `tfdist-launch --strategy horovod --workers 2 script.py`" in output
    assert not list((tmp_path / "mw").glob("*.json")), "no process may train (report) alone"

    control = _launch(tmp_path / "hvd", "horovod")
    assert control.returncode == 0, (control.stdout + control.stderr)[-3000:]
    reports = sorted((tmp_path / "hvd").glob("*.json"))
    assert [p.name for p in reports] == ["rank_0.json", "rank_1.json"]
    assert all(json.loads(p.read_text()) == {"size": 2} for p in reports)


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_a_failed_rank_is_named_with_its_status_and_last_lines(tmp_path, controller):
    # Once: "task horovodrun failed first (exit status 1)" with horovodrun's own traceback, and
    # the rank's error visible only with --verbose.
    if controller == "mpi" and shutil.which("mpirun") is None:
        pytest.skip("OpenMPI's mpirun is not installed (bash launch/setup.sh installs it)")
    python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": python_path, "TFDIST_LAUNCH_VERBOSE": "0"}
    command = [sys.executable, "-m", "tfdist.launcher.cli", "--timeout", "90", "--strategy",
               "horovod", "--workers", "2", *(["--mpi"] if controller == "mpi" else []),
               str(SCRIPTS / "rank_fails.py")]
    proc = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=150)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out[-3000:]
    assert "task rank:1 failed first (exit status 3); every task stopped" in out, out[-3000:]
    last_lines = out.split("Its last lines:", 1)[1]
    assert "rank 1 gives up: no data for it" in last_lines
    assert "rank 0 waits" not in last_lines  # rank 1's lines, not the job's
