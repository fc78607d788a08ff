"""SIGTERM to tfdist-launch mid-epoch: a 2-worker fit saves at the step it is in, exits 75, leaves
no process, and the rerun ends with the weights of a run that was never interrupted."""

from __future__ import annotations

import json
import os
import re
import shutil
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

SCRIPT = Path(__file__).parent / "scripts" / "preempt_train.py"
REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS, TOTAL = 8, 24  # as in the script: 3 epochs of 8 steps
PAUSE_AT = 10  # global step (epoch 2, step 2); SIGTERM then, the save lands a step or two later
# A generous grace: this 2-core machine is shared, and a save cut short would read as a failure.
LAUNCH = [sys.executable, "-m", "tfdist.launcher.cli", "--workers", "2", "--timeout", "240",
          "--preemption-grace", "90"]


def _start(tmp_path: Path, name: str, backup: Path, *launcher_args: str, script: str = str(SCRIPT),
           **env: str) -> subprocess.Popen[str]:
    results = tmp_path / f"{name}-results"
    results.mkdir()
    return subprocess.Popen(
        [*LAUNCH, *launcher_args, script, str(backup)],
        # Saving at the step on SIGTERM is tf-keras's (Keras 3's BackupAndRestore keeps epochs).
        env={**os.environ, "TF_USE_LEGACY_KERAS": "1", **env, RESULT_DIR_ENV: str(results),
             "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _finish(tmp_path: Path, name: str, proc: subprocess.Popen[str]) -> tuple[str, dict]:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    results = tmp_path / f"{name}-results"
    return out, {p.stem: json.loads(p.read_text()) for p in results.glob("*.json")}


def _preempt(tmp_path: Path, name: str, backup: Path, *launcher_args: str,
             script: str = str(SCRIPT), **env: str) -> tuple[str, int]:
    """Runs a job, SIGTERMs the launcher once both workers paused after PAUSE_AT steps."""
    proc = _start(tmp_path, name, backup, *launcher_args, script=script,
                  PAUSE_AT_STEP=str(PAUSE_AT), **env)
    lines: list[str] = []
    deadline = time.monotonic() + 200
    while sum(f"paused after step {PAUSE_AT}" in line for line in lines) < 2:
        assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
        lines.append(proc.stdout.readline())
    tasks = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert wait_gone(tasks, timeout=10) == [], "a task outlived the preempted launcher"
    return "".join(lines) + out, proc.returncode


def _assert_same_weights(got: dict, want: dict) -> None:
    for worker in ("worker_0", "worker_1"):
        for a, b in zip(got[worker]["weights"], want["worker_0"]["weights"], strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The uninterrupted run, one step per execution: both parameters' reruns end on its weights
    (2 steps per execution train the same batches in the same order; measured: identical)."""
    tmp_path = tmp_path_factory.mktemp("plain")
    _, results = _finish(tmp_path, "plain", _start(tmp_path, "plain", tmp_path / "plain-backup",
                                                   STEPS_PER_EXECUTION="1"))
    assert len(results["worker_0"]["ran"]) == TOTAL
    return results


@pytest.mark.parametrize("per_execution", [1, 2])
def test_sigterm_saves_at_the_current_step_and_the_rerun_ends_like_an_uninterrupted_run(
        tmp_path, plain, per_execution):
    spe = {"STEPS_PER_EXECUTION": str(per_execution)}

    backup = tmp_path / "backup"
    log, status = _preempt(tmp_path, "preempted", backup, **spe)
    assert status == 75, log
    found = re.search(r"job preempted: every training task saved a checkpoint at the step it was "
                      r"in and exited with status 75\. worker:0: saved a checkpoint at epoch "
                      rf"(\d+), after step (\d+), in {re.escape(str(backup))}/chief\.", log)
    assert found, log
    epoch, step = int(found[1]) - 1, int(found[2])  # 0-based epoch, steps done in it
    assert PAUSE_AT < epoch * STEPS + step <= PAUSE_AT + 3 * per_execution, found[0]
    assert 0 < step < STEPS, f"not mid-epoch: {found[0]}"
    saved = tmp_path / "saved-backup"
    shutil.copytree(backup, saved)  # for the sabotage below

    _, resumed = _finish(tmp_path, "resumed", _start(tmp_path, "resumed", backup, **spe))
    # The rerun starts at the step after the save, mid-epoch, and runs only the steps left.
    assert resumed["worker_0"]["ran"][0] == [epoch, step]
    assert len(resumed["worker_0"]["ran"]) == (TOTAL - (epoch * STEPS + step)) // per_execution
    _assert_same_weights(resumed, plain)

    # Sabotage: the same rerun with its input started at the first batch ends elsewhere.
    _, sabotaged = _finish(tmp_path, "no-input-resume", _start(
        tmp_path, "no-input-resume", saved, NO_INPUT_RESUME="1", **spe))
    assert sabotaged["worker_0"]["ran"][0] == [epoch, step]
    with pytest.raises(AssertionError):
        _assert_same_weights(sabotaged, plain)


def test_without_saving_on_sigterm_the_job_exits_143_and_the_rerun_repeats_the_epoch(tmp_path):
    backup = tmp_path / "backup"
    # TF's runtime catches SIGTERM under MultiWorkerMirrored and training goes on; a grace
    # shorter than the script's pause has the paused tasks SIGKILLed.
    log, status = _preempt(tmp_path, "preempted", backup, "--preemption-grace", "2",
                           SAVE_BEFORE_PREEMPTION="0")
    assert status == 143, log
    assert ("Not saved on SIGTERM: worker:0 (exit status -9), worker:1 (exit status -9)"
            in log), log
    _, resumed = _finish(tmp_path, "resumed",
                         _start(tmp_path, "resumed", backup, SAVE_BEFORE_PREEMPTION="0"))
    assert resumed["worker_0"]["ran"][0] == [1, 0]  # back to the start of epoch 2


def test_a_custom_loop_with_the_preemption_handler_resumes_at_the_step_it_saved(tmp_path):
    script = str(Path(__file__).parent / "scripts" / "preempt_custom_loop.py")
    _, plain = _finish(tmp_path, "plain",
                       _start(tmp_path, "plain", tmp_path / "plain-ckpt", script=script))
    assert plain["worker_0"]["ran"] == list(range(1, 25))

    ckpt = tmp_path / "ckpt"
    log, status = _preempt(tmp_path, "preempted", ckpt, script=script)
    assert status == 75, log
    found = re.search(rf"worker:0: saved a checkpoint at step (\d+), in {re.escape(str(ckpt))}\.",
                      log)
    assert found, log
    saved = int(found[1])
    assert PAUSE_AT < saved <= PAUSE_AT + 3, found[0]

    _, resumed = _finish(tmp_path, "resumed", _start(tmp_path, "resumed", ckpt, script=script))
    assert resumed["worker_0"]["ran"] == list(range(saved + 1, 25))
    _assert_same_weights(resumed, plain)


def test_keras3_fit_saves_at_the_step_and_the_rerun_ends_like_an_uninterrupted_run(tmp_path):
    """Keras 3: tfdist's step backup (`tfdist.resilience.keras3_backup`) saves where tf-keras's
    does; the rerun calls the saved steps of the epoch without running them (its step callbacks
    still see them), and its input resumes at the saved step."""
    keras3 = {"TF_USE_LEGACY_KERAS": "0"}
    _, plain = _finish(tmp_path, "plain", _start(tmp_path, "plain", tmp_path / "plain-backup",
                                                 **keras3))
    assert len(plain["worker_0"]["ran"]) == TOTAL

    backup = tmp_path / "backup"
    log, status = _preempt(tmp_path, "preempted", backup, **keras3)
    assert status == 75, log
    found = re.search(r"worker:0: saved a checkpoint at step (\d+), in "
                      rf"{re.escape(str(backup))}\.", log)
    assert found, log
    saved = int(found[1])
    assert PAUSE_AT < saved <= PAUSE_AT + 3 and saved % STEPS, found[0]  # mid-epoch
    shutil.copytree(backup, tmp_path / "saved-backup")  # for the sabotage below

    _, resumed = _finish(tmp_path, "resumed", _start(tmp_path, "resumed", backup, **keras3))
    epoch = saved // STEPS
    assert resumed["worker_0"]["ran"][0] == [epoch, 0]
    assert len(resumed["worker_0"]["ran"]) == TOTAL - epoch * STEPS
    _assert_same_weights(resumed, plain)
    assert not backup.exists(), "the finished job left its backup behind"

    # Sabotage: the same rerun with its input started at the first batch ends elsewhere.
    _, sabotaged = _finish(tmp_path, "no-input-resume", _start(
        tmp_path, "no-input-resume", tmp_path / "saved-backup", NO_INPUT_RESUME="1", **keras3))
    with pytest.raises(AssertionError):
        _assert_same_weights(sabotaged, plain)
