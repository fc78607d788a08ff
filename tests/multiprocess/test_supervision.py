"""Supervision exists once: the same failure scenarios, run through the local task group
(`LocalTasks`, also the one of ``--hosts``' ssh tasks) and Ray's (`RayGang`), end the same way.

Each scenario is a real plan (its strategy's traits decide who is a service, a sidecar, restarted
alone, fatal) whose every task runs a tiny script without TensorFlow
(``scripts/supervision_task.py``); the scenario says what the tasks do, which signal the launcher
gets once they are ready, and the outcome: the exit status and the lines the job must print.
After each run no task process is left. The Ray cluster is a one-node cluster started in this
process once for the module (``ray.init``, loopback only, about 5 s).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tfdist.launcher.local.tasks import LocalTasks
from tfdist.launcher.plan import JobOptions, plan_job
from tfdist.launcher.supervisor import Supervisor, run_attempts
from tfdist.testing import wait_gone

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).parent / "scripts" / "supervision_task.py"
PS_JOB = {"strategy": "parameter_server", "ps": 1, "workers": 2, "script_on_all_tasks": True}
RESTARTED_ALONE = "worker:1 exited with status 9; restarting it alone (1/3)"


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A job, what its tasks do (``mode``), a signal sent once ``ready`` tasks are ready, and
    the outcome both runners must give."""

    mode: str
    options: dict[str, Any]
    status: int
    says: tuple[str, ...]
    signal: signal.Signals | None = None
    ready: int = 0
    starts: dict[str, int] = dataclasses.field(default_factory=dict)


SCENARIOS = {
    "a_task_fails_first": Scenario(
        "fail_worker1", {"workers": 3}, 3,
        ("task worker:1 failed first (exit status 3); every task stopped. Its last lines:",
         "worker 1 gives up")),
    "a_sidecar_crashes_and_training_goes_on": Scenario(
        "fail_evaluator", {"workers": 2, "evaluator": True}, 0,
        ("[tfdist] sidecar evaluator:0 exited with status 4; job goes on. Its last lines:",
         "evaluator gives up", ": 3 tasks succeeded")),
    "a_ps_worker_is_restarted_alone": Scenario(
        "restart_worker1", PS_JOB, 0,
        (f"[tfdist] {RESTARTED_ALONE}. Its last lines:", "worker 1 dies",
         "[tfdist] worker:1 restarted (pid ", "restarted alone: {'worker:1': 1}"),
        starts={"worker:1": 2, "worker:0": 1, "ps:0": 1, "chief:0": 1}),
    "losing_the_ps_is_fatal": Scenario(
        "kill_ps", PS_JOB, 9,
        ("ps:0 died: parameter-server loss is fatal; its variables are gone. Restart the job",
         "Exit status 9; every task stopped. Its last lines:", "ps 0 dies")),
    "max_restarts_reruns_the_gang": Scenario(
        "fail_once", {"workers": 2, "max_restarts": 1}, 0,
        ("task worker:1 failed first (exit status 5)",
         "restarting the whole job (1/1) after exit status 5", ": 2 tasks succeeded"),
        starts={"worker:0": 2, "worker:1": 2}),
    "the_job_times_out": Scenario(
        "sleep", {"workers": 2, "timeout": 2}, 124,
        ("The job did not finish within 2 s; still running: worker:0, worker:1. Every task "
         "was stopped.", "Last lines of worker:1:\nworker:1 started (sleep)")),
    "sigterm_with_every_task_saved_is_a_preemption": Scenario(
        "save_on_sigterm", {"workers": 2}, 75,
        ("received SIGTERM: forwarding it to every task; 25 s to save and exit",
         "job preempted: every training task saved a checkpoint at the step it was in and "
         "exited with status 75. worker:0: saved a checkpoint at step 7 in /ckpt/worker:0. "
         "Run the same command again to resume from that step."),
        signal=signal.SIGTERM, ready=2),
    "sigterm_with_a_task_not_saved_is_143": Scenario(
        "worker1_ignores_sigterm", {"workers": 2, "preemption_grace": 1, "max_restarts": 2}, 143,
        ("job stopped by SIGTERM; every task stopped. Not saved on SIGTERM: worker:1 (exit "
         "status -9)",), signal=signal.SIGTERM, ready=2),
    "ctrl_c_stops_the_job": Scenario(
        "save_on_sigterm", {"workers": 2}, 130,
        ("Ctrl-C: stopping every task", "interrupted (Ctrl-C) after "),
        signal=signal.SIGINT, ready=2),
}

RAY = pytest.mark.ray, pytest.mark.slow


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """A one-node Ray cluster of this process, on loopback, for the module's Ray cases."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed: pip install 'tfdist[ray]' (launch/setup.sh does)")
    import ray

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             _node_ip_address="127.0.0.1")
    try:
        yield
    finally:
        ray.shutdown()


def _signal_when_ready(marker_dir: Path, count: int, sig: signal.Signals) -> threading.Thread:
    """Sends ``sig`` to this process (the launcher) once ``count`` tasks are ready."""
    def send() -> None:
        deadline = time.monotonic() + 120
        while len(list(marker_dir.glob("*.ready"))) < count:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        os.kill(os.getpid(), sig)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    return sender


def _groups(runner: str, request: pytest.FixtureRequest) -> Callable[[Any], Any]:
    """Makes the runner's task group for one attempt of a plan."""
    if runner == "local":
        return LocalTasks
    request.getfixturevalue("ray_cluster")
    from tfdist.launcher.ray.gang import RayGang, RayOptions

    return lambda plan: RayGang(plan, RayOptions(gang_timeout=60))


def _starts(marker_dir: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in marker_dir.glob("*.start.*"):
        task = path.name.split(".start.", 1)[0]
        counts[task] = counts.get(task, 0) + 1
    return counts


@pytest.mark.parametrize("runner", ["local", pytest.param("ray", marks=RAY)])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_same_scenario_ends_the_same_way_on_every_runner(name, runner, request, tmp_path,
                                                             capsys):
    scenario = SCENARIOS[name]
    options = {"timeout": 60, "network": "host", "strategy": "multi_worker", **scenario.options}
    plan = plan_job(JobOptions(str(SCRIPT), (scenario.mode, str(tmp_path)), **options))
    make = _groups(runner, request)
    sender = (_signal_when_ready(tmp_path, scenario.ready, scenario.signal)
              if scenario.signal else None)
    status = run_attempts(Supervisor.for_plan(plan), plan.options.max_restarts, make(plan),
                          lambda: make(plan))
    if sender is not None:
        sender.join(timeout=5)
    out = "".join(capsys.readouterr())
    sys.stdout.write(out)  # shown when the test fails
    assert status == scenario.status, out
    for line in scenario.says:
        assert line in out, f"{line!r} missing from:\n{out}"
    if scenario.starts:
        assert _starts(tmp_path) == scenario.starts
    pids = [int(p.name.rsplit(".", 1)[1]) for p in tmp_path.glob("*.start.*")]
    assert wait_gone(pids, timeout=10) == [], "a task outlived its job"
