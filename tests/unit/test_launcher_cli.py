"""tfdist-launch argument checks and --dry-run output (no process is started)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tfdist.cluster import ClusterSpec
from tfdist.launcher import arguments, cli


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('train')\n")
    return str(path)


def _dry_run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[dict]:
    assert cli.main(["--dry-run", *argv]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--strategy", "ring"], "Unknown strategy 'ring'"),
        (["--workers", "0", "{script}"], "--workers must be at least 1. Received: 0"),
        (["--ps", "1", "--strategy", "multi_worker", "{script}"], "has no parameter servers"),
        (["--strategy", "parameter_server", "{script}"], "needs --ps 1 or more"),
        (["--ps", "1", "--no-chief", "--strategy", "parameter_server", "{script}"], "coordinator"),
        (["--strategy", "mirrored", "--workers", "2", "{script}"], "use --strategy multi_worker"),
        ([], "missing SCRIPT"),
        (["--timeout", "nan", "{script}"], "--timeout must be a positive number of seconds"),
        (["--timeout", "-5", "{script}"], "--timeout must be a positive number of seconds"),
        (["--log-dir", "/proc/no/such", "{script}"], "--log-dir '/proc/no/such' cannot be used"),
        (["--strategy", "horovod", "--evaluator", "{script}"],
         "--evaluator was given with --strategy horovod, which has no evaluator task"),
        (["--strategy", "horovod", "--chief", "{script}"], "which has no chief task"),
        (["--strategy", "default", "--evaluator", "{script}"], "which has no evaluator task"),
        (["--hosts", "", "{script}"], "--hosts is empty (an unset shell variable?)"),
        (["--workers", "1", "--hosts", "n9:1", "{script}"], "need a multi-process strategy"),
        (["--image", "me/t:1", "{script}"], "--image only applies with --export"),
        (["--nodes", "2", "{script}"], "--nodes only applies with --export"),
        (["--export", "kubeflow", "--image", "", "{script}"], "--image is empty"),
        (["--export", "slurm", "--output", "/tmp", "{script}"], "--output '/tmp' is a directory"),
        (["--startup-timeout", "0", "{script}"], "--startup-timeout must be a positive number"),
        (["--preemption-grace", "-1", "{script}"],
         "--preemption-grace must be 0 or more seconds. Received: -1.0"),
        (["--preemption-grace", "inf", "{script}"], "--preemption-grace must be 0 or more"),
        (["no_such_script.py"], "script not found: 'no_such_script.py'"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, message, script, capsys):
    argv = [a.replace("{script}", script) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.strip().splitlines()[-1].startswith("tfdist-launch: error:")


def test_dry_run_multi_worker_gives_each_worker_its_tf_config(script, capsys):
    lines = _dry_run(capsys, ["--workers", "2", script, "--epochs", "3"])
    assert [line["task"] for line in lines] == [
        {"type": "worker", "index": 0},
        {"type": "worker", "index": 1},
    ]
    cluster = lines[0]["tf_config"]["cluster"]
    assert set(cluster) == {"worker"} and len(set(cluster["worker"])) == 2
    for i, line in enumerate(lines):
        assert line["tf_config"] == {"cluster": cluster, "task": {"type": "worker", "index": i}}
        assert line["command"] == [sys.executable, "-u", script, "--epochs", "3"]
        assert json.loads(line["env"]["TF_CONFIG"]) == line["tf_config"]
        assert line["env"].get("TF_USE_LEGACY_KERAS") == os.environ.get("TF_USE_LEGACY_KERAS")
        assert line["host"] == "localhost"
    ClusterSpec.from_tf_config(lines[1]["tf_config"], strategy="multi_worker")


def test_dry_run_parameter_server_runs_the_script_on_the_chief_only(script, capsys):
    lines = _dry_run(capsys, ["--ps", "2", "--workers", "2", "--evaluator", script])
    by_task = {f"{line['task']['type']}:{line['task']['index']}": line for line in lines}
    assert sorted(by_task) == ["chief:0", "evaluator:0", "ps:0", "ps:1", "worker:0", "worker:1"]
    assert by_task["chief:0"]["command"][-1] == script and by_task["chief:0"]["kind"] == "main"
    for name in ("ps:0", "ps:1", "worker:0", "worker:1"):
        assert by_task[name]["command"][-2:] == ["-m", "tfdist.server"]
        assert by_task[name]["kind"] == "service"
    assert by_task["evaluator:0"]["kind"] == "sidecar"
    assert "evaluator" not in by_task["evaluator:0"]["tf_config"]["cluster"]
    assert by_task["evaluator:0"]["tf_config"]["task"] == {"type": "evaluator", "index": 0}


def test_dry_run_horovod_lists_ranks_without_tf_config(script, capsys):
    lines = _dry_run(capsys, ["--strategy", "horovod", "--workers", "2", script])
    assert [line["task"] for line in lines] == [
        {"type": "worker", "index": 0},
        {"type": "worker", "index": 1},
    ]
    assert all(line["tf_config"] is None for line in lines)
    assert lines[0]["env"]["TFDIST_STRATEGY"] == "horovod"


def test_mpi_starts_horovodrun_with_its_mpi_controller(script):
    from tfdist.launcher.placement import place
    from tfdist.launcher.plan import JobOptions, plan_job

    def runner(mpi: bool) -> tuple[str, ...]:
        placement = place(plan_job(JobOptions(script, strategy="horovod", mpi=mpi)))
        return placement.tasks[0].command

    if shutil.which("mpirun") is None:
        pytest.skip("mpirun is not installed: --mpi is refused (see the next test)")
    from tfdist.horovod.checks import built_in_library

    if built_in_library("mpi") is False:
        pytest.skip("Horovod is built without MPI: --mpi is refused (test_horovod_checks.py)")
    assert "--mpi" in runner(True) and "--gloo" not in runner(True)
    assert "--gloo" in runner(False) and "--mpi" not in runner(False)


def test_mpi_is_refused_for_other_strategies_and_without_mpirun(script, capsys, monkeypatch):
    with pytest.raises(SystemExit, match="2"):
        cli.main(["--dry-run", "--strategy", "multi_worker", "--mpi", script])
    assert "--mpi was given with --strategy multi_worker" in capsys.readouterr().err
    monkeypatch.setenv("PATH", "/nonexistent")
    assert cli.main(["--dry-run", "--strategy", "horovod", "--mpi", script]) == 2
    err = capsys.readouterr().err
    assert "--mpi needs OpenMPI's mpirun" in err and "apt-get install openmpi-bin" in err


def test_auto_strategy_follows_the_counts(script, capsys):
    assert _dry_run(capsys, ["--workers", "1", script])[0]["tf_config"] is None
    assert _dry_run(capsys, ["--ps", "1", "--workers", "1", script])[0]["env"][
        "TFDIST_STRATEGY"
    ] == "parameter_server"


def test_env_var_defaults_are_named_in_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "TFDIST_LAUNCH_STRATEGY" in out and "TFDIST_LAUNCH_TIMEOUT" in out


def test_single_process_strategies_default_to_one_worker(script, capsys):
    for strategy in ("default", "mirrored"):
        lines = _dry_run(capsys, ["--strategy", strategy, script])
        assert len(lines) == 1 and lines[0]["env"]["TFDIST_STRATEGY"] == strategy
    assert len(_dry_run(capsys, ["--strategy", "multi_worker", script])) == 2


@pytest.mark.parametrize("variable,value,expected", [
    ("WORKERS", "abc", "expected an integer"),
    ("TIMEOUT", "abc", "expected a number"),  # once blamed on --timeout
    ("NETWORK", "privte", "expected one of private, host"),  # once ran on the host network
    ("VERBOSE", "maybe", "expected 1 or 0"),
    ("SSH_PORT", "22x", "expected an integer"),
])
def test_a_bad_environment_default_is_refused_naming_the_variable(
        script, monkeypatch, capsys, variable, value, expected):
    monkeypatch.setenv(f"TFDIST_LAUNCH_{variable}", value)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--workers", "2", "--timeout", "60", script])  # flags given: still refused
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"TFDIST_LAUNCH_{variable}={value!r} is not a value of --" in err, err
    assert expected in err and "Fix: export" in err


def test_an_unknown_launcher_variable_is_refused_not_ignored(script, monkeypatch, capsys):
    monkeypatch.setenv("TFDIST_LAUNCH_NETWROK", "private")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--dry-run", script])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "TFDIST_LAUNCH_NETWROK is not a variable tfdist-launch reads" in err
    assert "TFDIST_LAUNCH_NETWORK," in err  # the list to choose from


def test_each_environment_default_is_an_option_named_in_help(capsys):
    parser = cli.build_parser()
    flags = {flag for action in parser._actions for flag in action.option_strings}
    help_text = parser.format_help()
    for name in arguments.environment_defaults():
        assert f"--{name.lower().replace('_', '-')}" in flags, name
        assert f"TFDIST_LAUNCH_{name}" in " ".join(help_text.split()), name


def test_good_environment_defaults_are_taken(script, monkeypatch, capsys):
    monkeypatch.setenv("TFDIST_LAUNCH_NETWORK", "host")
    monkeypatch.setenv("TFDIST_LAUNCH_VERBOSE", "true")
    monkeypatch.setenv("TFDIST_LAUNCH_WORKERS", "3")
    assert len(_dry_run(capsys, ["--strategy", "multi_worker", script])) == 3


def test_pipeline_options_reach_the_tasks_as_the_strategy_reads_them(script, capsys):
    from tfdist.pipeline.config import PipelineConfig

    lines = _dry_run(capsys, ["--stages", "2", "--micro-batches", "3", "--schedule", "1f1b",
                              "--workers", "4", script])
    assert {line["env"]["TFDIST_STRATEGY"] for line in lines} == {"pipeline"}
    configs = {PipelineConfig.from_env(line["env"]) for line in lines}
    assert configs == {PipelineConfig(stages=2, micro_batches=3, schedule="1f1b")}
    only_stages = _dry_run(capsys, ["--stages", "2", "--workers", "2", script])[0]["env"]
    assert "TFDIST_PIPELINE_MICRO_BATCHES" not in only_stages  # only what was given is written


def test_the_batch_norm_opt_in_reaches_the_tasks_from_the_command_line(script, capsys):
    from tfdist.pipeline.config import PipelineConfig

    lines = _dry_run(capsys, ["--stages", "2", "--micro-batches", "4", "--batch-norm",
                              "per_micro_batch", "--workers", "2", script])
    assert {line["env"]["TFDIST_PIPELINE_BATCH_NORM"] for line in lines} == {"per_micro_batch"}
    assert {PipelineConfig.from_env(line["env"]).batch_norm for line in lines} == {
        "per_micro_batch"}
    assert "--batch-norm POLICY" in cli.build_parser().format_help()
    with pytest.raises(SystemExit) as exit_info:  # a strategy without the option refuses it
        cli.main(["--dry-run", "--strategy", "multi_worker", "--workers", "2", "--batch-norm",
                  "per_micro_batch", script])
    assert exit_info.value.code == 2
    assert "--batch-norm" in capsys.readouterr().err


def test_plan_job_decides_auto_workers_and_layout_once_for_python_callers(script):
    from tfdist.launcher.hosts.layout import HostOptions
    from tfdist.launcher.options import ExportOptions, StrategyOptions
    from tfdist.launcher.plan import JobOptions, LayoutError, plan_job

    plan = plan_job(JobOptions(script, strategy="mirrored"))
    assert (plan.strategy, plan.options.workers, plan.roles) == ("mirrored", 1, {"chief": 1})
    auto = plan_job(JobOptions(script, export=ExportOptions("mpijob")))
    assert (auto.strategy, auto.options.strategy, auto.roles) == ("horovod", "horovod",
                                                                   {"worker": 2})
    staged = plan_job(JobOptions(script, strategy_options=StrategyOptions(stages=2)))
    assert staged.strategy == "pipeline" and staged.env["TFDIST_PIPELINE_STAGES"] == "2"
    with pytest.raises(LayoutError, match="need a multi-process strategy"):
        plan_job(JobOptions(script, strategy="default", hosts=HostOptions(hosts="n9:1")))


def test_a_malformed_tf_config_in_the_launchers_environment_is_refused(script, monkeypatch, capsys):
    monkeypatch.setenv("TF_CONFIG", "{bad json")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--strategy", "default", script])  # once failed late, in the task
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "In tfdist-launch's own environment: TF_CONFIG is not a JSON object" in err
    assert "Received: '{bad json'" in err and "Fix: unset TF_CONFIG" in err


def test_the_launchers_own_tf_config_reaches_no_task(script, monkeypatch, capsys):
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": {"worker": ["localhost:1", "localhost:2"]}, "task": {"type": "worker"}}))
    (single,) = _dry_run(capsys, ["--strategy", "default", script])
    assert single["tf_config"] is None and single["unset_env"] == ["TF_CONFIG"]
    for task in _dry_run(capsys, ["--workers", "2", script]):  # each gets its own
        assert task["tf_config"]["cluster"]["worker"] != ["localhost:1", "localhost:2"]


def test_an_absurd_micro_batch_count_is_refused_before_start(script, capsys):
    # Once accepted (with --dry-run too); each task then built an unbounded schedule.
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--dry-run", "--stages", "2", "--workers", "2", "--micro-batches",
                  "100000000000", script])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "micro_batches=100000000000 is more than a pipeline step can schedule" in err
    assert "at most 1024" in err
