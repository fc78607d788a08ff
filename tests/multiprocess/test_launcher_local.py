"""tfdist-launch on this machine: gang start, failure propagation, restarts, and no orphans.

The task script needs no TensorFlow, so these tests take seconds; orphans are counted from the
PIDs every task records.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tfdist.testing import alive, wait_gone

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).parent / "scripts" / "launcher_task.py"
LAUNCH = [sys.executable, "-m", "tfdist.launcher.cli"]


def _launch(tmp_path: Path, mode: str, *argv: str) -> subprocess.Popen[str]:
    env = {**os.environ, "LAUNCHER_TEST_MODE": mode, "MARKER_DIR": str(tmp_path)}
    return subprocess.Popen(
        [*LAUNCH, *argv, str(SCRIPT)], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )


def _task_pids(marker_dir: Path) -> list[int]:
    return [int(p.name.rsplit(".", 1)[1]) for p in marker_dir.glob("*.pid.*")]


def _wait_for_tasks(marker_dir: Path, count: int, timeout: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout
    while len(_task_pids(marker_dir)) < count:
        assert time.monotonic() < deadline, f"only {_task_pids(marker_dir)} started"
        time.sleep(0.05)
    return _task_pids(marker_dir)


def _no_orphans(pids: list[int], timeout: float = 10) -> bool:
    return wait_gone(pids, timeout) == []


def test_every_task_runs_with_prefixed_output(tmp_path):
    proc = _launch(tmp_path, "ok", "--workers", "2", "--chief")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    for task in ("chief:0", "worker:0", "worker:1"):
        assert f"[{task}] task {task} mode ok" in out
    assert ": 3 tasks succeeded" in out and "job finished in " in out


def test_a_failing_task_stops_the_job_with_its_status_and_last_lines(tmp_path):
    proc = _launch(tmp_path, "fail_worker1", "--workers", "3")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3, out
    assert "task worker:1 failed first (exit status 3)" in out
    assert "worker 1 gives up" in out.split("failed first", 1)[1]
    assert _no_orphans(_task_pids(tmp_path))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_no_task_outlives_the_launcher(tmp_path, sig):
    proc = _launch(tmp_path, "sleep", "--ps", "1", "--workers", "2")
    pids = _wait_for_tasks(tmp_path, 1)  # the chief runs the script; ps/workers run servers
    deadline = time.monotonic() + 30
    while len(children := [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]) < 4:
        assert time.monotonic() < deadline, "chief, 2 workers and a ps should be running"
        time.sleep(0.05)
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    assert _no_orphans(pids + children), f"left behind after {sig.name}: {alive(pids + children)}"
    if sig != signal.SIGKILL:  # SIGTERM: a preemption the tasks did not save on (143)
        assert proc.returncode == (130 if sig == signal.SIGINT else 143)


def _sigterm_when_ready(proc: subprocess.Popen[str], tasks: int) -> str:
    """Sends SIGTERM once ``tasks`` tasks said they are ready; returns the launcher's output."""
    lines: list[str] = []
    deadline = time.monotonic() + 30
    while sum(" ready" in line for line in lines) < tasks:
        assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
        lines.append(proc.stdout.readline())
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    return "".join(lines) + out


def test_sigterm_is_forwarded_and_a_job_whose_tasks_saved_exits_preempted(tmp_path):
    proc = _launch(tmp_path, "save_on_sigterm", "--workers", "2")
    out = _sigterm_when_ready(proc, 2)
    assert proc.returncode == 75, out
    assert "received SIGTERM: forwarding it to every task; 25 s to save and exit" in out
    assert ("job preempted: every training task saved a checkpoint at the step it was in and "
            "exited with status 75. worker:0: saved a checkpoint at step 7 in /ckpt/worker:0. "
            "Run the same command again to resume from that step.") in out
    assert "restarting" not in out
    assert _no_orphans(_task_pids(tmp_path))


def test_a_task_that_does_not_save_within_the_grace_is_killed_and_named(tmp_path):
    proc = _launch(tmp_path, "worker1_ignores_sigterm", "--workers", "2",
                   "--preemption-grace", "1", "--max-restarts", "2")
    started = time.monotonic()
    out = _sigterm_when_ready(proc, 2)
    assert proc.returncode == 143, out
    assert time.monotonic() - started < 20, "the task ignoring SIGTERM was not killed in time"
    assert "Not saved on SIGTERM: worker:1 (exit status -9)" in out
    assert "restarting" not in out, "a preempted job must not be restarted by the launcher"
    assert _no_orphans(_task_pids(tmp_path))


def test_max_restarts_restarts_the_whole_gang(tmp_path):
    proc = _launch(tmp_path, "fail_once", "--workers", "2", "--max-restarts", "2")
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, out
    assert "restarting the whole job (1/2) after exit status 5" in out
    restarted = len(list(tmp_path.glob("worker:0.pid.*")))
    assert restarted == 2, "worker:0 was not restarted with the gang"


def test_timeout_stops_the_job(tmp_path):
    proc = _launch(tmp_path, "sleep", "--workers", "2", "--timeout", "2")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 124
    assert "did not finish within 2 s" in out
    assert _no_orphans(_task_pids(tmp_path))


def test_a_crashing_evaluator_is_reported_and_training_goes_on(tmp_path):
    proc = _launch(tmp_path, "fail_evaluator", "--workers", "2", "--chief", "--evaluator")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "sidecar evaluator:0 exited with status 4; job goes on" in out
    for task in ("chief:0", "worker:0", "worker:1"):
        assert f"[{task}] {task} trained" in out
    assert ": 4 tasks succeeded" in out and "job finished in " in out


def test_a_task_that_cannot_start_stops_the_gang(tmp_path):
    from tfdist.cluster import Task
    from tfdist.launcher.local.tasks import run_placement
    from tfdist.launcher.placement import Placement, TaskPlan
    from tfdist.launcher.plan import JobOptions, plan_job

    sleeper = TaskPlan("worker:0", Task("worker", 0), "localhost", None,
                       (sys.executable, "-c", "import time; time.sleep(120)"))
    missing = TaskPlan("worker:1", Task("worker", 1), "localhost", None,
                       (str(tmp_path / "no-such-program"),))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    plan = plan_job(JobOptions("t.py", strategy="multi_worker", timeout=30))
    assert run_placement(Placement(plan, (sleeper, missing))) == 127
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert _no_orphans(list(left))


def test_a_job_whose_tasks_all_finish_within_the_grace_succeeds(tmp_path):
    proc = _launch(tmp_path, "finish_on_sigterm", "--workers", "2")
    out = _sigterm_when_ready(proc, 2)
    assert proc.returncode == 0, out
    assert "job finished: every training task completed within the preemption grace" in out
