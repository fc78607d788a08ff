"""tfdist-launch --export: TFJob, MPIJob and Slurm exports parse and describe the local job."""

from __future__ import annotations

import collections
import doctest
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tfdist import startup_hook
from tfdist.cluster import ClusterSpec
from tfdist.errors import StrategyConfigError
from tfdist.launcher import cli
from tfdist.launcher.export.documents import export_job as export_plan
from tfdist.launcher.placement import place
from tfdist.launcher.plan import JobOptions, plan_job
from tfdist.launcher.slurm import task as slurm_task

KUBEFLOW = {"Chief": "chief", "Worker": "worker", "PS": "ps", "Evaluator": "evaluator"}
JOBS = [
    JobOptions("train.py", ("--epochs", "3"), workers=2),
    JobOptions("train.py", workers=3, chief=True, evaluator=True),
    JobOptions("train.py", workers=2, ps=1),
    JobOptions("train.py", workers=2, ps=2, evaluator=True),
    JobOptions("train.py", strategy="mirrored", workers=1),
]
SLURM_ENV = {"SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}


def _local_roles(options: JobOptions) -> dict[str, int]:
    placement = place(plan_job(options))
    placement.release()
    return dict(collections.Counter(t.task.type for t in (placement.ranks or placement.tasks)))


def export_job(options: JobOptions, fmt: str, **export) -> str:
    return export_plan(plan_job(options), fmt, **export)


@pytest.mark.parametrize("options", JOBS)
def test_plan_roles_match_the_local_placement(options):
    assert dict(plan_job(options).roles) == _local_roles(options)


@pytest.mark.parametrize("options", JOBS)
def test_tfjob_parses_and_has_the_local_replica_counts(options):
    job = yaml.safe_load(export_job(options, "kubeflow", image="me/train:1"))
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "TFJob")
    specs = job["spec"]["tfReplicaSpecs"]
    assert {KUBEFLOW[k]: v["replicas"] for k, v in specs.items()} == _local_roles(options)
    is_ps = options.ps > 0
    for kind, spec in specs.items():
        assert spec["restartPolicy"] == "OnFailure"
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == "tensorflow" and container["image"] == "me/train:1"
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["TFDIST_STRATEGY"] == ("parameter_server" if is_ps else
                                          "mirrored" if options.strategy == "mirrored" else
                                          "multi_worker")
        assert ("TF_USE_LEGACY_KERAS" in env) == ("TF_USE_LEGACY_KERAS" in os.environ)
        server = is_ps and kind in ("Worker", "PS")
        expected = (["python", "-u", "-m", "tfdist.server"] if server
                    else ["python", "-u", "train.py", *options.script_args])
        assert container["command"] == expected


def test_mpijob_runs_horovodrun_over_the_operator_hostfile():
    options = JobOptions("train.py", ("--lr", "0.1"), strategy="horovod", workers=4)
    job = yaml.safe_load(export_job(options, "mpijob", slots_per_worker=2))
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    assert job["spec"]["slotsPerWorker"] == 2
    replicas = job["spec"]["mpiReplicaSpecs"]
    assert replicas["Launcher"]["replicas"] == 1
    assert replicas["Worker"]["replicas"] * 2 == _local_roles(options)["worker"] == 4
    (launcher,) = replicas["Launcher"]["template"]["spec"]["containers"]
    assert launcher["command"] == ["horovodrun", "-np", "4", "--hostfile", "/etc/mpi/hostfile",
                                   "--gloo", "python", "-u", "train.py", "--lr", "0.1"]


def test_mpijob_with_mpi_runs_horovodrun_over_mpi():
    options = JobOptions("train.py", strategy="horovod", workers=2, mpi=True)
    job = yaml.safe_load(export_job(options, "mpijob"))
    (launcher,) = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    assert "--mpi" in launcher["command"] and "--gloo" not in launcher["command"]


@pytest.mark.parametrize(
    ("fmt", "options", "message"),
    [
        ("kubeflow", JobOptions("t.py", strategy="horovod"),
         "use --export mpijob or slurm for Horovod"),
        ("mpijob", JobOptions("t.py", workers=2, ps=1), "add --strategy horovod"),
        ("mpijob", JobOptions("t.py", strategy="horovod", workers=3), "Received: --workers 3"),
        ("slurm", JobOptions("t.py", workers=2), "Received: --nodes 5 for 2 task(s)"),
        ("slurm", JobOptions("t.py", strategy="horovod", workers=2, mpi=True),
         "Received: --export slurm with --mpi"),
    ],
)
def test_impossible_exports_say_why_and_how_to_fix(fmt, options, message):
    extra = {"slots_per_worker": 2} if fmt == "mpijob" else {"nodes": 5} if fmt == "slurm" else {}
    with pytest.raises(StrategyConfigError, match="Fix:") as err:
        export_job(options, fmt, **extra)
    assert message in str(err.value)


def _srun_shim_args(script: str) -> list[str]:
    """The arguments the sbatch script's srun line passes to the shim (bash quoting undone)."""
    (line,) = [line for line in script.splitlines() if line.startswith("srun ")]
    words = shlex.split(line.replace("${SLURM_SUBMIT_DIR:-.}/.tfdist-${SLURM_JOB_ID:-0}", "D"))
    return words[words.index("tfdist.launcher.slurm.task") + 1:]


@pytest.mark.parametrize(
    ("options", "layout"),
    [
        (JobOptions("train.py", ("--epochs", "3"), workers=2, ps=1), {"ps": 1, "chief": True}),
        (JobOptions("train.py", workers=3, chief=True), {"chief": True}),
        (JobOptions("train.py", workers=4), {}),
    ],
)
def test_sbatch_is_valid_bash_and_each_rank_gets_the_tf_config_of_the_same_cluster(
    options, layout, tmp_path
):
    script = export_job(options, "slurm", nodes=2)
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks=4\n#SBATCH --ntasks-per-node=2\n" in script
    assert "\nsrun --kill-on-bad-exit=1 --label python -m tfdist.launcher.slurm.task " in script
    args = slurm_task.parse_args(_srun_shim_args(script))
    assert args.command == ["python", "-u", "train.py", *options.script_args]
    strategy = "parameter_server" if options.ps else "multi_worker"
    expected = ClusterSpec.from_hosts("node1:2,node2:2", **layout)
    assert sum(_local_roles(options).values()) == len(expected.tasks()) == 4
    for rank, task in enumerate(expected.tasks()):
        plan = slurm_task.plan_slurm_task(
            args.command, {**SLURM_ENV, "SLURM_PROCID": str(rank)}, strategy=args.strategy,
            ps=args.ps, chief=args.chief, evaluator=args.evaluator, base_port=args.base_port,
        )
        assert args.strategy == strategy and plan.task == task
        assert plan.tf_config == expected.tf_config(task.type, task.index)
        server = strategy == "parameter_server" and task.type in ("worker", "ps")
        assert (plan.kind == "service") == server


def test_sbatch_keeps_the_submitter_s_pythonpath_after_the_job_s(tmp_path):
    script = export_job(JobOptions("train.py", workers=2), "slurm", nodes=2)
    exports = "".join(line + "\n" for line in script.splitlines() if line.startswith("export "))
    probe = tmp_path / "exports.sh"
    probe.write_text("set -euo pipefail\n" + exports + 'echo "$PYTHONPATH"\n')
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": "/submitter/lib"}
    seen = subprocess.run(["bash", str(probe)], env=env, capture_output=True, text=True,
                          check=True).stdout.strip().split(os.pathsep)
    assert seen[0] == str(startup_hook.HOOK_DIR) and seen[-1] == "/submitter/lib"
    unset = subprocess.run(["bash", str(probe)], env={"PATH": os.environ["PATH"]},
                           capture_output=True, text=True, check=True).stdout.strip()
    assert unset.split(os.pathsep)[0] == str(startup_hook.HOOK_DIR) and "/submitter" not in unset


def test_shim_dry_run_prints_the_rank_s_tf_config(tmp_path):
    env = {**SLURM_ENV, "SLURM_PROCID": "3", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "tfdist.launcher.slurm.task", "--strategy", "parameter_server",
         "--ps", "1", "--chief", "--dry-run", "--", "python", "train.py"],
        env=env, capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2],
    ).stdout
    plan = json.loads(out)
    spec = ClusterSpec.from_hosts("node1:2,node2:2", ps=1, chief=True)
    assert plan["task"] == "ps:0" and plan["kind"] == "service"
    assert plan["tf_config"] == spec.tf_config("ps", 0)


def test_horovod_sbatch_serves_the_rendezvous_beside_srun_and_ranks_get_horovod_variables():
    pytest.importorskip("horovod.runner", reason="Horovod is not installed")
    script = export_job(JobOptions("train.py", strategy="horovod", workers=4), "slurm", nodes=2)
    (line,) = [line for line in script.splitlines() if "srun" in line]
    assert line.startswith("python -m tfdist.launcher.slurm.horovod -- srun --kill-on-bad-exit=1 ")
    args = slurm_task.parse_args(line.split(" tfdist.launcher.slurm.task ")[1].split())
    env = {**SLURM_ENV, "SLURM_PROCID": "1", "SLURMD_NODENAME": "node2", "SLURM_LOCALID": "0",
           "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "9"}
    plan = slurm_task.plan_slurm_task(args.command, env, strategy=args.strategy)
    assert plan.tf_config is None and plan.command == ("python", "-u", "train.py")
    # Slurm rank 1 under --distribution=cyclic runs on node2 first: Horovod rank 2, host-major.
    assert {k: plan.env[k] for k in ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
                                     "HOROVOD_CROSS_RANK", "HOROVOD_HOSTNAME")} == {
        "HOROVOD_RANK": "2", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "0",
        "HOROVOD_CROSS_RANK": "1", "HOROVOD_HOSTNAME": "node2"}
    assert plan.env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "9"
    del env["HOROVOD_GLOO_RENDEZVOUS_PORT"]
    with pytest.raises(StrategyConfigError, match=r"need a rendezvous.*Fix: start srun through "
                       r"`python -m tfdist.launcher.slurm.horovod -- srun"):
        slurm_task.plan_slurm_task(args.command, env, strategy=args.strategy)


def test_shim_names_the_task_its_rank_and_node_when_its_command_is_killed(monkeypatch, capfd):
    monkeypatch.setenv("SLURM_PROCID", "2")
    monkeypatch.setenv("SLURMD_NODENAME", "node2")
    plan = slurm_task.SlurmTaskPlan(
        slurm_task.Task("worker", 1), {"cluster": {}, "task": {}},
        (sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"), "main")
    assert slurm_task.run(plan) == 128 + 9
    assert ("[tfdist] task worker:1 (Slurm rank 2 on node node2) was killed by SIGKILL; the job "
            "step ends") in capfd.readouterr().err


def test_shim_runs_a_sidecar_evaluator_failure_as_success():
    plan = slurm_task.SlurmTaskPlan(
        slurm_task.Task("evaluator", 0), {"cluster": {}, "task": {}},
        (sys.executable, "-c", "raise SystemExit(3)"), "sidecar",
    )
    assert slurm_task.run(plan) == 0


def test_shim_servers_stop_when_the_chief_writes_the_done_file(tmp_path):
    done = tmp_path / "done"
    server = slurm_task.SlurmTaskPlan(
        slurm_task.Task("ps", 0), None, (sys.executable, "-c", "import time; time.sleep(60)"),
        "service",
    )
    chief = slurm_task.SlurmTaskPlan(
        slurm_task.Task("chief", 0), None, (sys.executable, "-c", "pass"), "main"
    )
    assert slurm_task.run(chief, str(done)) == 0 and done.read_text() == "0\n"
    assert slurm_task.run(server, str(done)) == -15  # SIGTERMed as soon as it saw the file


def test_cli_export_prints_or_writes(tmp_path, capsys):
    argv = ["--export", "kubeflow", "--ps", "1", "--workers", "2", "remote/train.py"]
    assert cli.main(argv) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["spec"]["tfReplicaSpecs"]["PS"]["replicas"] == 1
    out = tmp_path / "job.yaml"
    assert cli.main([*argv[:-1], "--output", str(out), "remote/train.py"]) == 0
    assert yaml.safe_load(out.read_text()) == printed
    assert cli.main(["--export", "kubeflow", "--strategy", "horovod", "t.py"]) == 2
    assert "use --export mpijob or slurm for Horovod" in capsys.readouterr().err


def test_yaml_export_without_pyyaml_names_the_extra_and_slurm_still_works(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml now raises ImportError
    argv = ["--export", "kubeflow", "--image", "me/t:1", "--workers", "2", "train.py"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "PyYAML is not installed" in err and "pip install 'tfdist[export]'" in err
    assert cli.main(["--export", "slurm", "--nodes", "2", "--workers", "2", "train.py"]) == 0
    assert "#SBATCH" in capsys.readouterr().out


def test_slurm_horovod_doctests_and_dry_run(capsys):
    """Its examples start a real rendezvous on loopback (so they need Horovod)."""
    pytest.importorskip("horovod.runner", reason="Horovod is not installed")
    from tfdist.launcher.slurm import horovod as slurm_horovod

    assert doctest.testmod(slurm_horovod).failed == 0
    env = {**SLURM_ENV, "SLURMD_NODENAME": "localhost"}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        assert slurm_horovod.main(["--dry-run", "--", "srun", "x"]) == 0
    assert capsys.readouterr().out == (
        "rendezvous on 127.0.0.1:<free port> for 4 rank(s); then: srun x\n")
