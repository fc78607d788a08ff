"""What tfdist-launch prints by default, with --verbose, and into --log-dir (real processes).

The default view: one line per task started, the chief's output without TensorFlow's C++
start-up chatter, the summary; a failed task's last lines whatever the view. The conftest sets
TFDIST_LAUNCH_VERBOSE=1 for the other tests; these unset it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).parent / "scripts" / "launcher_task.py"
LAUNCH = [sys.executable, "-m", "tfdist.launcher.cli"]
CHATTER = ("absl::InitializeLog", "oneDNN custom operations", "Could not find cuda drivers",
           "failed call to cuInit")


def _run(*argv: str, env: dict[str, str] | None = None,
         timeout: float = 90) -> subprocess.CompletedProcess[str]:
    child_env = {k: v for k, v in os.environ.items() if k != "TFDIST_LAUNCH_VERBOSE"}
    return subprocess.run([*LAUNCH, *argv], env={**child_env, **(env or {})}, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


def test_default_view_is_the_chief_and_one_line_per_task(tmp_path):
    logs = tmp_path / "logs"
    out = _run("--workers", "2", "--chief", "--log-dir", str(logs), str(SCRIPT),
               env={"LAUNCHER_TEST_MODE": "ok"})
    assert out.returncode == 0, out.stdout
    lines = out.stdout.splitlines()
    assert [line for line in lines if line.startswith("[chief:0]")] == [
        line for line in lines if "mode ok" in line] and len(lines) == 7, out.stdout
    assert "[tfdist-launch] output of worker:0, worker:1 hidden unless it fails" in lines[0]
    started = [line for line in lines if " started " in line]
    assert [s.split(" started ")[1].split(" ")[0] for s in started] == [
        "chief:0", "worker:0", "worker:1"]
    assert all(" at localhost:" in s for s in started)
    assert not any('"tf_config"' in line for line in lines), "the plan is --verbose's"
    for task in ("chief_0", "worker_0", "worker_1"):  # --log-dir keeps every task's output
        assert "mode ok pid" in (logs / f"{task}.log").read_text()


def test_verbose_shows_every_task_and_its_plan(tmp_path):
    out = _run("--verbose", "--workers", "2", str(SCRIPT), env={"LAUNCHER_TEST_MODE": "ok"})
    assert out.returncode == 0, out.stdout
    for task in ("worker:0", "worker:1"):
        assert f"[{task}] task {task} mode ok" in out.stdout
    assert sum('"tf_config"' in line for line in out.stdout.splitlines()) == 2


def test_a_hidden_task_that_fails_still_shows_its_last_lines(tmp_path):
    out = _run("--workers", "3", str(SCRIPT), env={"LAUNCHER_TEST_MODE": "fail_worker1"})
    assert out.returncode == 3, out.stdout
    before, after = out.stdout.split("task worker:1 failed first (exit status 3)", 1)
    assert "worker 1 gives up" not in before and "worker 1 gives up" in after


def test_tensorflow_startup_chatter_is_hidden_unless_verbose(tmp_path):
    script = tmp_path / "imports_tf.py"
    script.write_text("import tensorflow as tf\nprint('sum', int(tf.reduce_sum([2, 3])))\n")
    env = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(Path(__file__).parents[2])}
    quiet = _run("--strategy", "default", str(script), env=env)
    loud = _run("--strategy", "default", "--verbose", str(script), env=env)
    assert quiet.returncode == loud.returncode == 0, quiet.stdout + loud.stdout
    assert "[chief:0] sum 5" in quiet.stdout and "[chief:0] sum 5" in loud.stdout
    shown = [c for c in CHATTER if c in loud.stdout]
    assert shown, f"TensorFlow printed none of {CHATTER}: nothing to test\n{loud.stdout}"
    assert not [c for c in shown if c in quiet.stdout], quiet.stdout
