"""What the launcher says: tfdist's info lines in the tasks (--quiet), no wall-clock limit by
default, the last line (elapsed time, processes, Horovod ranks, what was written), and Ctrl-C.

No TensorFlow: the tasks are small Python programs; the Ctrl-C test runs ``tfdist-launch`` itself
(2 processes, about 3 s).
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tfdist import logs
from tfdist.horovod import checks
from tfdist.launcher import cli
from tfdist.launcher.output import LineView
from tfdist.launcher.process import ProcessGroup
from tfdist.launcher.summary import done_line
from tfdist.launcher.supervisor import Supervisor, task_group_class

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('never run')\n")
    return str(path)


def test_the_default_waits_for_the_job_and_timeout_stays_for_who_asks(script, monkeypatch):
    monkeypatch.delenv("TFDIST_LAUNCH_TIMEOUT", raising=False)
    plan = cli.parse_args(["--workers", "2", script]).plan
    assert plan.options.timeout is None and Supervisor.for_plan(plan).timeout is None
    assert cli.parse_args(["--timeout", "30", script]).plan.options.timeout == 30
    monkeypatch.setenv("TFDIST_LAUNCH_TIMEOUT", "90")
    assert cli.parse_args([script]).plan.options.timeout == 90


def test_without_a_timeout_a_job_runs_to_its_end(capsys):
    # 0.6 s of work: a zero or tiny default deadline would stop it (exit 124).
    group = ProcessGroup(stream=io.StringIO())
    group.start("worker:0", [PY, "-c", "import time; time.sleep(0.6)"])
    assert Supervisor(timeout=None).run(group) == 0
    # at least the 0.6 s of work (a loaded machine adds its start-up)
    seconds = float(re.search(r"job finished in ([0-9.]+) s", capsys.readouterr().err)[1])
    assert 0.6 <= seconds < 30
    timed = ProcessGroup(stream=io.StringIO())
    timed.start("worker:0", [PY, "-c", "import time; time.sleep(30)"])
    started = time.monotonic()
    assert Supervisor(timeout=0.5).run(timed) == 124  # --timeout still bounds the job
    assert time.monotonic() - started < 10


def test_the_tasks_get_info_lines_by_default_and_quiet_leaves_them_out(script):
    env = cli.parse_args(["--workers", "2", script]).plan.env
    assert (env[logs.LOG_LEVEL_ENV], env[logs.REPORT_ENV]) == ("INFO", "1")
    quiet = cli.parse_args(["--quiet", "--workers", "2", script]).plan.env
    assert quiet[logs.LOG_LEVEL_ENV] == "WARNING"


INFO_SCRIPT = textwrap.dedent("""
    import logging, sys
    import tfdist
    if sys.argv[1:] == ["configured"]:
        logging.basicConfig(level=logging.INFO, format="root: %(message)s")
    logging.getLogger("tfdist").info("chose strategy 'multi_worker'")
    logging.getLogger("tfdist").warning("a warning")
""")


@pytest.mark.parametrize(("level", "argv", "expected"), [
    ("INFO", [], ["tfdist: chose strategy 'multi_worker'", "tfdist: a warning"]),
    ("WARNING", [], ["tfdist: a warning"]),  # --quiet
    ("", [], ["a warning"]),  # not launched: as before (Python's last-resort handler)
    ("INFO", ["configured"], ["root: chose strategy 'multi_worker'", "root: a warning"]),
])
def test_info_lines_print_once_at_the_level_the_launcher_set(level, argv, expected):
    env = {**os.environ, logs.LOG_LEVEL_ENV: level, "PYTHONPATH": str(REPO)}
    result = subprocess.run([PY, "-c", INFO_SCRIPT, *argv], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == expected


def test_the_last_line_names_the_time_and_what_was_written(capsys, tmp_path):
    writer = (f"from tfdist.logs import report_written; report_written('model', "
              f"{str(tmp_path / 'm.keras')!r}); report_written('TensorBoard', "
              f"{str(tmp_path / 'tb')!r}); print('done')")
    out = io.StringIO()
    group = ProcessGroup(stream=out)
    env = {**os.environ, logs.REPORT_ENV: "1", "PYTHONPATH": str(REPO)}
    group.start("worker:0", [PY, "-c", writer], env=env, show=LineView())
    group.start("worker:1", [PY, "-c", "print('done')"], env=env, show=LineView())
    assert Supervisor(timeout=None).run(group) == 0
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("[tfdist-launch] job finished in ")
    assert last.endswith(f": 2 tasks succeeded. Wrote: model {tmp_path / 'm.keras'}; "
                         f"TensorBoard {tmp_path / 'tb'}")
    assert sorted(out.getvalue().splitlines()) == ["[worker:0] done", "[worker:1] done"]


def test_a_horovod_job_is_counted_in_ranks(script, monkeypatch):
    # Planned as with Horovod built with Gloo, whether or not this environment has it.
    monkeypatch.setattr(checks, "check_installed", lambda: None)
    monkeypatch.setattr(checks, "built_in_library", lambda controller, library=None: True)
    plan = cli.parse_args(["--strategy", "horovod", "--workers", "2", script]).plan
    tasks = task_group_class("local")(plan)
    try:
        members = tasks.members()
    finally:
        tasks.placement.release()
    assert [(m.name, m.ranks) for m in members] == [("horovodrun", 2)]
    assert done_line(members, 3.0, {}) == "job finished in 3.0 s: 2 Horovod ranks succeeded"


CTRL_C_SCRIPT = textwrap.dedent("""
    import json, os, signal, sys, time
    from tfdist.logs import report_written
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    if index == 0:
        report_written("backups", sys.argv[1])
    def wind_down(*_):  # prints while it stops, as a TensorFlow task does
        for i in range(20):
            print("winding down", i, flush=True)
            time.sleep(0.05)
        sys.exit(0)
    signal.signal(signal.SIGTERM, wind_down)
    open(os.path.join(sys.argv[2], f"ready-{index}"), "w").close()
    while True:
        print("step", flush=True)
        time.sleep(0.1)
""")


@pytest.mark.multiprocess
@pytest.mark.cold_start  # the tasks import no TensorFlow: a warm server would only cost its start
def test_ctrl_c_stops_the_output_at_once_and_says_what_was_stopped_and_saved(tmp_path):
    train = tmp_path / "train.py"
    train.write_text(CTRL_C_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    launcher = subprocess.Popen(
        [PY, "-m", "tfdist.launcher.cli", "--workers", "2", "--network", "host", str(train),
         str(tmp_path / "backup"), str(tmp_path)], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        assert launcher.stdout is not None
        for line in launcher.stdout:  # until both train
            lines.append(line.rstrip("\n"))
            if line.startswith("[worker:0] step") and (tmp_path / "ready-1").exists():
                break
        launcher.send_signal(signal.SIGINT)
        sent = time.monotonic()
        rest, _ = launcher.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if launcher.poll() is None:
            launcher.kill()
    after = rest.splitlines()
    assert launcher.returncode == 130
    assert took < 10, f"Ctrl-C took {took:.1f} s"
    stop = next(i for i, line in enumerate(after) if "Ctrl-C: stopping every task" in line)
    assert not [line for line in after[stop:] if line.startswith("[worker:")], after
    assert not [line for line in lines + after if "winding down" in line]
    assert after[-1].startswith("[tfdist-launch] interrupted (Ctrl-C) after ")
    assert after[-1].endswith(": stopped worker:0 (exit status 0), worker:1 (exit status 0). "
                              f"Wrote: backups {tmp_path / 'backup'}")


PREEMPTED_TASK = """
import pathlib, signal, sys, time
def saved(*_):
    print("saved at the step", flush=True)
    sys.exit(75)
signal.signal(signal.SIGTERM, saved)
pathlib.Path(sys.argv[1]).write_text("ready")
time.sleep(60)
"""
FIRST_PREEMPTED = """
import pathlib, sys, time
while not pathlib.Path(sys.argv[1]).exists():
    time.sleep(0.05)
sys.exit(75)
"""


def test_a_task_preempted_on_its_own_stops_the_job_as_a_preemption(capsys, tmp_path):
    # SIGTERM to one pipeline task once read "worker:0 failed first (exit status 75)"
    ready = str(tmp_path / "ready")
    group = ProcessGroup(stream=io.StringIO())
    group.start("worker:0", [PY, "-c", FIRST_PREEMPTED, ready])
    group.start("worker:1", [PY, "-c", PREEMPTED_TASK, ready])
    assert Supervisor(timeout=60, preemption_grace=20).run(group) == 75
    err = capsys.readouterr().err
    assert "worker:0 exited with status 75: it was preempted (SIGTERM) and saved" in err
    assert "job preempted: every training task saved a checkpoint" in err
    assert "failed first" not in err


def test_a_stuck_peer_is_named_not_the_task_that_timed_out_waiting_for_it(capsys):
    # a shard alive but not joining made the launcher blame worker:0, whose step deadline fired
    from tfdist.errors import STEP_DEADLINE_MARKER

    group = ProcessGroup(stream=io.StringIO())
    timed_out = (f"import sys, time; time.sleep(1); print({STEP_DEADLINE_MARKER!r} + ' of 1 s "
                 "waiting for its tensor group of 2', file=sys.stderr, flush=True); sys.exit(1)")
    group.start("worker:0", [PY, "-c", timed_out])
    group.start("worker:1", [PY, "-c", "import time; time.sleep(60)"])  # stuck, alive
    assert Supervisor(timeout=60).run(group) == 1
    err = capsys.readouterr().err
    assert "task worker:1 did not join the step that task worker:0 waited for" in err
    assert "task worker:0 failed at its step deadline (exit status 1)" in err
    assert "failed first" not in err
