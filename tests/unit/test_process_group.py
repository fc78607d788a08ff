"""ProcessGroup: prefixed output, failure propagation, timeouts and no orphaned processes."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tfdist.errors import LaunchError, TaskFailedError, TaskTimeoutError
from tfdist.launcher.process import ProcessGroup, _is_stopped
from tfdist.testing import alive, report, run_tasks, task_name, wait_gone

PY = sys.executable
SLEEP = [PY, "-c", "import time; time.sleep(120)"]


def _alive(pid: int) -> bool:
    return alive([pid]) == [pid]


def test_output_is_prefixed_with_the_task_name():
    out = io.StringIO()
    with ProcessGroup(stream=out) as group:
        group.start("worker:0", [PY, "-c", "print('a'); print('b')"])
        group.start("chief:0", [PY, "-c", "print('c')"])
        codes = group.wait(timeout=30)
    assert codes == {"worker:0": 0, "chief:0": 0}
    lines = sorted(out.getvalue().splitlines())
    assert lines == ["[chief:0] c", "[worker:0] a", "[worker:0] b"]


def test_first_failure_is_raised_with_its_task_status_and_last_lines_and_others_stop():
    out = io.StringIO()
    group = ProcessGroup(stream=out, grace_period=2)
    sleeper = group.start("worker:0", SLEEP)
    group.start("worker:1", [PY, "-c", "print('boom'); raise SystemExit(7)"])
    started = time.monotonic()
    expected = r"(?s)Task worker:1 failed with exit status 7.*boom"
    with pytest.raises(TaskFailedError, match=expected) as err:
        group.wait(timeout=60)
    assert err.value.task == "worker:1" and err.value.returncode == 7
    assert time.monotonic() - started < 10, "the other task was not stopped within seconds"
    assert not _alive(sleeper.pid)


def test_timeout_stops_every_task_and_names_those_still_running():
    group = ProcessGroup(stream=io.StringIO(), grace_period=1)
    task = group.start("worker:0", SLEEP)
    with pytest.raises(TaskTimeoutError, match=r"within 1 s; still running: worker:0"):
        group.wait(timeout=1)
    assert not _alive(task.pid)


def test_sigterm_ignoring_task_is_killed_after_the_grace_period():
    ignore = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ok', flush=True); time.sleep(120)"
    )
    group = ProcessGroup(stream=io.StringIO(), grace_period=0.5)
    task = group.start("ps:0", [PY, "-c", ignore], kind="service")
    time.sleep(0.5)
    started = time.monotonic()
    group.stop()
    assert not _alive(task.pid)
    assert time.monotonic() - started < 5


def test_grandchildren_are_stopped_with_their_task():
    spawn = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        "print(p.pid, flush=True); time.sleep(120)"
    )
    group = ProcessGroup(stream=io.StringIO(), grace_period=1)
    task = group.start("worker:0", [PY, "-c", spawn])
    deadline = time.monotonic() + 20
    while not task.tail and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(task.tail[0])
    group.stop()
    assert wait_gone([task.pid, grandchild]) == []


def test_sidecars_get_a_bounded_grace_period_after_the_main_tasks():
    # An evaluator finishing its last checkpoint after training ends: it runs to completion.
    out = io.StringIO()
    with ProcessGroup(stream=out, sidecar_grace=30) as group:
        group.start("chief:0", [PY, "-c", "pass"])
        group.start("evaluator:0", [PY, "-c", "import time; time.sleep(0.5); print('done')"],
                    kind="sidecar")
        codes = group.wait(timeout=60)
    assert codes["evaluator:0"] == 0 and "[evaluator:0] done" in out.getvalue()
    assert "waiting up to 30 s for sidecar(s) evaluator:0" in out.getvalue()
    # One that never ends is stopped once the grace has passed, and the job still succeeds.
    out = io.StringIO()
    started = time.monotonic()
    with ProcessGroup(stream=out, sidecar_grace=0.5, grace_period=1) as group:
        group.start("chief:0", [PY, "-c", "pass"])
        group.start("evaluator:0", SLEEP, kind="sidecar")
        codes = group.wait(timeout=30)
    assert codes["evaluator:0"] == -signal.SIGTERM and time.monotonic() - started < 15
    assert "sidecar(s) evaluator:0 still running after 0.5 s; stopping them" in out.getvalue()
    with pytest.raises(ValueError, match=r"sidecar_grace must be 0 or more seconds. Received: -1"):
        ProcessGroup(sidecar_grace=-1)


def test_service_exiting_early_fails_the_job_but_sidecar_failure_does_not():
    out = io.StringIO()
    with ProcessGroup(stream=out) as group:
        group.start("chief:0", [PY, "-c", "import time; time.sleep(0.8)"])  # outlives the sidecar
        group.start("evaluator:0", [PY, "-c", "raise SystemExit(3)"], kind="sidecar")
        codes = group.wait(timeout=30)
    assert codes["chief:0"] == 0 and group.sidecar_failures == {"evaluator:0": 3}
    assert "sidecar evaluator:0 exited with status 3; job goes on" in out.getvalue()

    with ProcessGroup(stream=io.StringIO()) as group:
        group.start("chief:0", SLEEP)
        group.start("ps:0", [PY, "-c", "raise SystemExit(0)"], kind="service")
        with pytest.raises(TaskFailedError, match="Task ps:0 failed with exit status 0"):
            group.wait(timeout=30)


def test_children_die_when_the_launching_process_is_sigkilled(tmp_path: Path):
    """A launcher killed with SIGKILL cannot clean up; the kernel must take its tasks down."""
    pid_file = tmp_path / "pids"
    launcher = textwrap.dedent(
        f"""
        import sys, time
        from tfdist.launcher.process import ProcessGroup
        group = ProcessGroup()
        tasks = [group.start(f"worker:{{i}}", {SLEEP!r}) for i in range(2)]
        open({str(pid_file)!r}, "w").write(" ".join(str(t.pid) for t in tasks))
        time.sleep(120)
        """
    )
    proc = subprocess.Popen([PY, "-c", launcher])
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "launcher did not start its tasks"
        time.sleep(0.05)
    pids = [int(p) for p in pid_file.read_text().split()]
    assert all(_alive(pid) for pid in pids)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert wait_gone(pids) == [], "tasks outlived their SIGKILLed launcher"


# A task that starts a child in its own process group and one in a new session (``setsid``), a
# grandchild that left its parent's group, prints their pids and either exits or sleeps.
_DETACH = (
    "import subprocess, sys, time; sleep = [sys.executable, '-c', 'import time; time.sleep(120)']; "
    "same = subprocess.Popen(sleep); left = subprocess.Popen(sleep, start_new_session=True); "
    "print(same.pid, left.pid, flush=True); time.sleep({linger})"
)


def _printed_pids(task, timeout: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout
    while not task.tail and time.monotonic() < deadline:
        time.sleep(0.05)
    return [int(pid) for pid in task.tail[0].split()]


def test_processes_that_left_their_task_group_end_with_the_job():
    # Before the job's cgroup, the setsid child of a task that exited 0 lived on.
    group = ProcessGroup(stream=io.StringIO(), grace_period=1)
    done = group.start("worker:0", [PY, "-c", _DETACH.format(linger=0.5)])
    running = group.start("worker:1", [PY, "-c", _DETACH.format(linger=120)], kind="service")
    pids = _printed_pids(done) + _printed_pids(running)
    assert alive(pids) == pids
    cgroup = group._containment.path
    assert group.wait(timeout=30)["worker:0"] == 0
    assert wait_gone(pids, timeout=5) == [], "descendants outlived the job"
    assert cgroup is None or not cgroup.exists(), f"the job's cgroup {cgroup} was left behind"


@pytest.mark.parametrize("cgroup", [True, False])
def test_every_descendant_ends_when_the_launching_process_is_sigkilled(tmp_path: Path, cgroup):
    """Same-group children, setsid grandchildren and the tasks: all end with a SIGKILLed launcher.

    Without a cgroup (not root) the guardian still ends each task's process group; only the
    processes that left it (setsid) may outlive the launcher, as the docs say.
    """
    pid_file = tmp_path / "pids"
    launcher = textwrap.dedent(
        f"""
        import sys, time
        import tfdist.launcher.containment as containment
        if not {cgroup}:
            containment.cgroup2_directory = lambda: None
        from tfdist.launcher.process import ProcessGroup
        group = ProcessGroup()
        detach = [sys.executable, "-c", {_DETACH.format(linger=120)!r}]
        tasks = [group.start(f"worker:{{i}}", detach) for i in range(2)]
        while not all(t.tail for t in tasks):
            time.sleep(0.05)
        pids = [t.pid for t in tasks] + [int(p) for t in tasks for p in t.tail[0].split()]
        open({str(pid_file)!r}, "w").write(" ".join(map(str, pids)))
        time.sleep(120)
        """
    )
    proc = subprocess.Popen([PY, "-c", launcher], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "launcher did not start its tasks"
        time.sleep(0.05)
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 6 and alive(pids) == pids
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    tasks_and_their_group, left_group = pids[:2] + pids[2::2], pids[3::2]
    try:
        assert wait_gone(pids if cgroup else tasks_and_their_group, timeout=10) == [], (
            "processes outlived their SIGKILLed launcher")
    finally:
        for pid in alive(left_group):
            os.kill(pid, signal.SIGKILL)


def test_run_tasks_collects_each_tasks_report():
    code = "import tfdist.testing as t; t.report({'name': t.task_name()})"
    env = {
        f"worker:{i}": {
            "TF_CONFIG": f'{{"cluster": {{}}, "task": {{"type": "worker", "index": {i}}}}}'
        }
        for i in range(2)
    }
    results = run_tasks(
        {name: [PY, "-c", code] for name in env}, env=env, timeout=60, stream=io.StringIO()
    )
    assert results == {"worker:0": {"name": "worker:0"}, "worker:1": {"name": "worker:1"}}


def test_task_name_reads_tf_config_then_horovod_rank():
    assert task_name({"HOROVOD_RANK": "3"}) == "rank:3"
    assert task_name({}) == "chief:0"
    report({"ignored": True})  # outside run_tasks: a no-op, not an error


def _fail_first_run(marker: Path) -> list[str]:
    """A service that exits 9 on its first run and serves (sleeps) on later runs, after writing
    ``<marker>.serving``."""
    code = (f"import os, sys, time; m = {str(marker)!r}\n"
            "if not os.path.exists(m): open(m, 'w').close(); print('dying'); sys.exit(9)\n"
            "print('serving', flush=True); open(m + '.serving', 'w').close(); time.sleep(120)")
    return [PY, "-c", code]


def _until_exists(path: Path, seconds: float = 60.0) -> list[str]:
    """A main task that ends once ``path`` exists (or after ``seconds``)."""
    return [PY, "-c", f"import os, time; end = time.monotonic() + {seconds}\n"
            f"while not os.path.exists({str(path)!r}) and time.monotonic() < end: time.sleep(0.05)"]


def test_a_restartable_task_is_restarted_alone_and_the_job_goes_on(tmp_path):
    out = io.StringIO()
    with ProcessGroup(stream=out, grace_period=1) as group:
        other = group.start("worker:0", SLEEP, kind="service")
        flaky = group.start("worker:1", _fail_first_run(tmp_path / "m"), kind="service",
                            max_restarts=2)
        first_pid = flaky.pid
        group.start("chief:0", _until_exists(tmp_path / "m.serving"))  # the restart served
        group.wait(timeout=60)
    assert flaky.restarts == 1 and flaky.pid != first_pid
    assert other.restarts == 0
    text = out.getvalue()
    assert "[tfdist] worker:1 exited with status 9; restarting it alone (1/2)" in text
    assert "[worker:1] serving" in text


def test_a_task_out_of_restarts_fails_the_job():
    group = ProcessGroup(stream=io.StringIO(), grace_period=1)
    group.start("chief:0", SLEEP)
    flaky = group.start("worker:1", [PY, "-c", "raise SystemExit(9)"], kind="service",
                        max_restarts=2)
    with pytest.raises(TaskFailedError, match="Task worker:1 failed with exit status 9"):
        group.wait(timeout=60)
    assert flaky.restarts == 2
    with pytest.raises(ValueError, match="max_restarts must be 0 or more. Received: -1"):
        group.start("worker:2", SLEEP, max_restarts=-1)


def test_a_log_dir_that_cannot_be_created_fails_the_job_at_once(tmp_path):
    """Before: the output thread died, and a chatty task blocked on a full pipe until timeout."""
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    chatty = [sys.executable, "-c", "import sys\nfor _ in range(20000): print('x' * 200)"]
    started = time.monotonic()
    with ProcessGroup(log_dir=not_a_dir / "logs", stream=io.StringIO()) as group:
        group.start("worker:0", chatty)
        with pytest.raises(LaunchError, match="worker:0: cannot write its log") as err:
            group.wait(timeout=60)
    assert time.monotonic() - started < 30
    assert "Fix: pass a --log-dir that can be created and written" in str(err.value)


def test_a_stopped_task_is_named_as_the_one_that_made_no_progress():
    # Once: worker:1 SIGSTOPped, worker:0 timed out waiting for it, and worker:0 was blamed.
    from tfdist.launcher.supervisor import Supervisor

    out = io.StringIO()
    group = ProcessGroup(stream=out, grace_period=0.5)
    stopped = group.start("worker:1", [PY, "-c",
                                       "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)"])
    deadline = time.monotonic() + 30
    while not _is_stopped(stopped.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    group.start("worker:0", [PY, "-c", "print('no answer from worker:1'); raise SystemExit(1)"])
    with pytest.raises(TaskFailedError) as err:
        group.wait(timeout=60)
    assert (err.value.task, err.value.returncode, err.value.stopped) == ("worker:0", 1,
                                                                          ("worker:1",))
    message = Supervisor(timeout=1)._failure_message(err.value)
    assert message.startswith("task worker:1 stopped making progress (its process was stopped")
    assert "task worker:0 failed waiting for it (exit status 1)" in message
    assert message.endswith("Last lines of worker:0:\nno answer from worker:1")
    assert wait_gone([task.pid for task in group.tasks.values()]) == []  # stopped ones too


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_mid_poll_waits_for_the_poll_to_end(capsys, sig):
    """SIGTERM (preemption) and SIGINT (Ctrl-C) reach the watch loop between polls, not inside
    one: an exception raised inside ``Popen.poll()`` can leave its wait lock held, and the stop
    that follows then waits forever (a CI run once saw a preempted launcher silent for 120 s).
    The group here signals its own process halfway through a poll; the poll must end, and the job
    then stops as that signal says."""
    from tfdist.launcher.supervisor import SIGTERM_STATUS, Supervisor

    class SignalledMidPoll(ProcessGroup):
        polls, finished = 0, 0

        def poll(self):
            self.polls += 1
            if self.polls == 2:
                signal.raise_signal(sig)  # the handler runs at once, in this thread
            codes = super().poll()
            self.finished += 1
            return codes

    group = SignalledMidPoll(stream=io.StringIO(), grace_period=5)
    group.start("worker:0", SLEEP)
    status = Supervisor(timeout=60, preemption_grace=5).run(group)
    assert group.finished == group.polls >= 2  # no poll was cut short
    err = capsys.readouterr().err
    if sig == signal.SIGTERM:
        assert status == SIGTERM_STATUS, err
        assert "received SIGTERM: forwarding it to every task" in err
    else:
        assert "Ctrl-C: stopping every task" in err
    assert wait_gone([task.pid for task in group.tasks.values()]) == []
