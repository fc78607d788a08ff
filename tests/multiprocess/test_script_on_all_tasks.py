"""``tfdist-launch --script-on-all-tasks``: a script written as TensorFlow's guide writes it runs
its own ``tf.distribute.Server(...).join()`` branch on worker and ps tasks, so what it sets there
(``GRPC_FAIL_FAST=use_caller``) takes effect. Without the flag those tasks run tfdist's server
and the branch never runs. Real processes: chief, one worker, one ps (about 20 s a run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "tf_guide_ps.py"


def _launch(tmp_path: Path, *flags: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    results = tmp_path / "results"
    results.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TFDIST_RESULT_DIR": str(results)}
    out = subprocess.run(
        [sys.executable, "-m", "tfdist.launcher.cli", "--ps", "1", "--workers", "1",
         "--timeout", "150", *flags, str(SCRIPT)],
        env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
    found = {p.stem.replace("_", ":"): json.loads(p.read_text()) for p in results.glob("*.json")}
    return out, found


def test_the_scripts_own_server_branch_runs_on_worker_and_ps(tmp_path):
    out, results = _launch(tmp_path, "--script-on-all-tasks")
    assert out.returncode == 0, out.stdout[-4000:]
    assert sorted(results) == ["chief:0", "ps:0", "worker:0"], out.stdout[-4000:]
    assert {r["grpc_fail_fast"] for r in results.values()} == {"use_caller"}
    chief = results["chief:0"]
    assert chief["variable_device"].startswith("/job:ps/"), chief
    # 12 SGD steps on y = 3x + 1, run one at a time on the worker, equal the same steps here.
    assert chief["weights"] == pytest.approx(chief["local_weights"], abs=1e-6), chief
    assert chief["weights"] != pytest.approx([0.0, 0.0], abs=0.1), "no step reached the ps"


def test_without_the_flag_tfdist_serves_and_the_branch_never_runs(tmp_path):
    out, results = _launch(tmp_path)
    assert out.returncode == 0, out.stdout[-4000:]
    assert sorted(results) == ["chief:0"], "worker/ps ran tfdist.server, not the script"
    assert results["chief:0"]["weights"] == pytest.approx(
        results["chief:0"]["local_weights"], abs=1e-6)


@pytest.mark.unit
def test_the_flag_is_refused_where_every_task_runs_the_script(tmp_path, capsys):
    from tfdist.launcher.cli import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--strategy", "multi_worker", "--script-on-all-tasks", str(SCRIPT)])
    assert ("--script-on-all-tasks was given with --strategy multi_worker, whose every task "
            "already runs the script. Fix: drop --script-on-all-tasks") in capsys.readouterr().err


@pytest.mark.unit
def test_exports_and_the_slurm_shim_run_the_script_on_every_task():
    import shlex

    from tfdist.launcher.export.documents import export_job
    from tfdist.launcher.plan import JobOptions, plan_job
    from tfdist.launcher.slurm import task as slurm_task

    options = JobOptions("train.py", workers=2, ps=1, script_on_all_tasks=True)
    plan = plan_job(options)
    assert {plan.task_argv(role, "python") for role in ("chief", "worker", "ps")} == {
        ("python", "-u", "train.py")}
    sbatch = export_job(plan, "slurm", python="python", nodes=2)
    (srun,) = [line for line in sbatch.splitlines() if line.startswith("srun ")]
    shim = slurm_task.parse_args(shlex.split(srun.split("tfdist.launcher.slurm.task", 1)[1]))
    assert shim.script_on_all_tasks
    env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_PROCID": "3"}
    ps = slurm_task.plan_slurm_task(shim.command, env, strategy="parameter_server", ps=1,
                                    chief=True, script_on_all_tasks=True)
    assert (str(ps.task), ps.command, ps.kind) == ("ps:0", ("python", "-u", "train.py"),
                                                   "service")
