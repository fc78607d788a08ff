"""``tfdist-launch --stages K --tensor T``: the job's mesh, its refusals, what --dry-run shows, and
what each task reads back (`tfdist.parallel.mesh.Mesh.from_environment`). No process is started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tfdist.core.detect import launch_strategy
from tfdist.core.registry import register, unregister
from tfdist.core.traits import PIPELINE_STAGES_ENV, StrategyTraits
from tfdist.errors import StrategyConfigError
from tfdist.launcher import cli
from tfdist.launcher.mesh_plan import option_fix, tensor_hosts_warning
from tfdist.launcher.options import JobOptions, StrategyOptions
from tfdist.launcher.placement import place
from tfdist.launcher.plan import LayoutError, plan_job
from tfdist.parallel.mesh import MESH_ENV, Mesh

pytestmark = pytest.mark.unit

# A strategy that takes --stages and --tensor, registered the way the tensor strategy registers
# (its traits name MESH_ENV); the launcher reads only traits, so its class is never imported.
SPLIT = "mesh_test_split"
SHARDS_ENV = "TFDIST_TEST_TENSOR_SHARDS"
SPLIT_TRAITS = StrategyTraits(roles=("chief", "worker"), launch_options={
    "stages": PIPELINE_STAGES_ENV, "tensor": SHARDS_ENV})


@pytest.fixture(autouse=True)
def split_strategy():
    register(SPLIT, "tfdist.strategies.multi_worker:MultiWorkerMirroredStrategy",
             traits=SPLIT_TRAITS, replace=True)
    yield
    unregister(SPLIT)


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('train')\n")
    return str(path)


def _dry_run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[list[dict], str]:
    assert cli.main(["--dry-run", *argv]) == 0
    out = capsys.readouterr()
    return [json.loads(line) for line in out.out.splitlines()], out.err


def _refusal(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_args(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_dry_run_shows_each_task_its_coordinates_and_groups_in_rank_order(capsys, script):
    lines, _ = _dry_run(capsys, ["--strategy", SPLIT, "--workers", "8", "--stages", "2",
                                 "--tensor", "2", script])
    assert len(lines) == 8
    for index, line in enumerate(lines):
        mesh = line["mesh"]
        d, p, t = (mesh["coordinates"][axis] for axis in ("data", "pipe", "tensor"))
        assert mesh["rank"] == index == (d * 2 + p) * 2 + t
        assert line["env"][MESH_ENV] == mesh["shape"] == "data=2,pipe=2,tensor=2"
        assert mesh["groups"]["tensor"]["members"] == [index - t, index - t + 1]
        assert mesh["groups"]["pipe"]["members"] == [(d * 2 + k) * 2 + t for k in range(2)]
        assert mesh["groups"]["data"]["members"] == [(k * 2 + p) * 2 + t for k in range(2)]
    assert [line["mesh"]["coordinates"] for line in lines[:3]] == [
        {"data": 0, "pipe": 0, "tensor": 0}, {"data": 0, "pipe": 0, "tensor": 1},
        {"data": 0, "pipe": 1, "tensor": 0}]
    keys = {line["mesh"]["groups"]["tensor"]["key"] for line in lines}
    assert len(keys) == 4  # one key per tensor group


def test_each_task_reads_its_own_place_back_from_its_environment(capsys, script):
    lines, _ = _dry_run(capsys, ["--strategy", SPLIT, "--chief", "--workers", "5", "--tensor", "2",
                                 script])
    places = [Mesh.from_environment(line["env"]) for line in lines]
    assert places == [(Mesh(data=3, tensor=2), rank) for rank in range(6)]
    assert lines[0]["task"] == {"type": "chief", "index": 0} and lines[0]["mesh"]["rank"] == 0


def test_a_pipeline_job_gets_its_mesh_and_its_pipeline_variables(capsys, script):
    lines, _ = _dry_run(capsys, ["--strategy", "pipeline", "--workers", "4", "--stages", "2",
                                 script])
    assert {line["env"][MESH_ENV] for line in lines} == {"data=2,pipe=2,tensor=1"}
    assert {line["env"]["TFDIST_PIPELINE_STAGES"] for line in lines} == {"2"}
    assert [line["mesh"]["coordinates"]["pipe"] for line in lines] == [0, 1, 0, 1]
    plain, _ = _dry_run(capsys, ["--strategy", "multi_worker", "--workers", "2", script])
    assert all(MESH_ENV not in line["env"] and "mesh" not in line for line in plain)


def test_a_pipeline_of_tensor_split_stages_links_equal_shards_of_neighbouring_stages(capsys,
                                                                                    script):
    lines, _ = _dry_run(capsys, ["--strategy", "pipeline", "--workers", "4", "--stages", "2",
                                 "--tensor", "2", script])
    assert {line["env"][MESH_ENV] for line in lines} == {"data=1,pipe=2,tensor=2"}
    assert not any("TFDIST_TENSOR_SHARDS" in line["env"] for line in lines)  # T: in the mesh
    assert {line["env"]["TFDIST_PIPELINE_STAGES"] for line in lines} == {"2"}
    assert [(c["pipe"], c["tensor"]) for c in (line["mesh"]["coordinates"] for line in lines)] \
        == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [line["mesh"]["groups"]["pipe"]["members"] for line in lines] == [[0, 2], [1, 3]] * 2
    assert [line["mesh"]["groups"]["tensor"]["members"] for line in lines] == \
        [[0, 1], [0, 1], [2, 3], [2, 3]]


def test_tensor_is_not_written_as_a_pipeline_variable():
    plan = plan_job(JobOptions("t.py", strategy=SPLIT, workers=4,
                               strategy_options=StrategyOptions(tensor=2)))
    assert plan.mesh == Mesh(data=2, tensor=2)
    assert plan.env[MESH_ENV] == "data=2,pipe=1,tensor=2"
    assert plan.env[SHARDS_ENV] == "2"  # the variable the strategy's traits name for T
    assert not any(name.startswith("TFDIST_PIPELINE") for name in plan.env)
    # A strategy whose traits carry T in the mesh's own variable gets the whole shape there.
    register(SPLIT, "tfdist.strategies.multi_worker:MultiWorkerMirroredStrategy", replace=True,
             traits=StrategyTraits(roles=("chief", "worker"), launch_options={"tensor": MESH_ENV}))
    plan = plan_job(JobOptions("t.py", strategy=SPLIT, workers=4,
                               strategy_options=StrategyOptions(tensor=2)))
    assert plan.env[MESH_ENV] == "data=2,pipe=1,tensor=2"


@pytest.mark.parametrize(("argv", "fragments"), [
    (["--strategy", "horovod", "--workers", "4", "--tensor", "2"],
     ["--tensor was given with --strategy horovod, which does not take it",
      "Fix: drop --tensor, or use --strategy ", f"--strategy {SPLIT}"]),
    (["--strategy", "multi_worker", "--workers", "2", "--tensor", "2"],
     ["--tensor was given with --strategy multi_worker", "(it takes: none)"]),
    (["--strategy", SPLIT, "--workers", "6", "--stages", "2", "--tensor", "2"],
     ["--stages 2 --tensor 2 with 6 process(es)", "Fix: use --workers 4 (or 8)"]),
    (["--strategy", SPLIT, "--workers", "3", "--tensor", "2"],
     ["--tensor 2 with 3 process(es)", "Expected: a multiple of 2", "use --workers 2 (or 4)"]),
    (["--strategy", SPLIT, "--workers", "2", "--tensor", "4"],
     ["--tensor 4 is more than the job's 2 process(es)",
      "Fix: use --workers 4 (or a multiple), or --tensor 2 or less"]),
    (["--strategy", SPLIT, "--workers", "2", "--stages", "2", "--tensor", "4"],
     ["--tensor 4 is more than the job's 2 process(es)", "use --workers 8"]),
    (["--strategy", SPLIT, "--workers", "4", "--tensor", "0"], ["--tensor: must be 1 or more"]),
    # the chief is a process of the mesh: the fix once suggested the --workers 2 already given
    (["--strategy", "tensor", "--chief", "--workers", "2", "--tensor", "2"],
     ["--tensor 2 with 3 process(es) (--workers 2 and the chief",
      "Fix: use --workers 1 with --chief, or --workers 2 without it"]),
    # refused at the launcher, not 49 s later inside the tasks
    (["--strategy", "pipeline", "--workers", "4", "--stages", "2", "--micro-batches", "4",
      "--schedule", "interleaved", "--tensor", "2"],
     ["--schedule interleaved --tensor 2: the interleaved schedule puts several chunks",
      "Fix: use --schedule 1f1b (or gpipe) with --tensor"]),
])
def test_a_mesh_that_cannot_be_is_refused_before_start_with_the_fix(argv, fragments, script,
                                                                     capsys):
    err = _refusal(capsys, [*argv, script])
    for fragment in fragments:
        assert fragment in err, err


def test_the_fix_names_the_strategies_the_registry_says_take_the_option():
    both = f"drop --stages, or use --strategy pipeline or --strategy {SPLIT}"
    assert option_fix("stages") == both
    assert option_fix("tensor").startswith("drop --tensor, or use ")
    assert f"--strategy {SPLIT}" in option_fix("tensor")
    unregister(SPLIT)
    if "--strategy" not in option_fix("tensor"):  # before the tensor strategy is registered
        assert option_fix("tensor") == "drop --tensor (no registered strategy takes it yet)"


def test_auto_with_tensor_alone_means_the_tensor_strategy():
    assert launch_strategy(workers=4, ps=0, tensor=2) == "tensor"
    assert launch_strategy(workers=4, ps=0, stages=2, tensor=2) == "pipeline"


def test_plan_job_raises_the_same_refusal_for_python_callers():
    with pytest.raises(LayoutError, match="--tensor 4 is more than"):
        plan_job(JobOptions("t.py", strategy=SPLIT, workers=2,
                            strategy_options=StrategyOptions(tensor=4)))


def test_tensor_groups_split_over_hosts_are_warned_about(capsys, script):
    lines, err = _dry_run(capsys, ["--strategy", SPLIT, "--workers", "6", "--tensor", "2",
                                   "--hosts", "198.51.100.1:3,198.51.100.2:3", script])
    assert [line["host"] for line in lines] == ["198.51.100.1"] * 3 + ["198.51.100.2"] * 3
    assert "tfdist-launch: warning: tensor group of ranks 2-3 spans hosts 198.51.100.1, " \
           "198.51.100.2" in err
    assert "will cross the network, and training will be slow" in err
    assert "Fix: give each host a multiple of 2 slots" in err
    _, fine = _dry_run(capsys, ["--strategy", SPLIT, "--workers", "4", "--tensor", "2",
                                "--hosts", "198.51.100.1:2,198.51.100.2:2", script])
    assert "warning" not in fine


def test_placement_carries_the_warning_for_runners():
    from tfdist.launcher.hosts.layout import HostOptions

    plan = plan_job(JobOptions("t.py", strategy=SPLIT, workers=4, hosts=HostOptions(
        hosts="198.51.100.1:1,198.51.100.2:3"), strategy_options=StrategyOptions(tensor=2)))
    placement = place(plan)
    placement.release()
    assert len(placement.warnings) == 1 and "ranks 0-1 spans hosts" in placement.warnings[0]
    assert tensor_hosts_warning(Mesh(data=2, tensor=2), ["a", "a", "b", "b"]) is None


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, (Mesh(), 0)),
    ({"TF_CONFIG": '{"cluster": {"chief": ["h:0"], "worker": ["h:1", "h:2"]}, '
                   '"task": {"type": "worker", "index": 1}}'}, (Mesh(data=3), 2)),
    ({MESH_ENV: "pipe=2", "TF_CONFIG": '{"cluster": {"worker": ["h:1", "h:2"]}, '
                                       '"task": {"type": "worker", "index": 0}}'},
     (Mesh(pipe=2), 0)),
])
def test_from_environment_reads_shape_and_rank(environ, expected):
    assert Mesh.from_environment(environ) == expected


@pytest.mark.parametrize(("environ", "fragment"), [
    ({MESH_ENV: "data=2,tensor=2"}, "disagree on the number of processes"),
    ({MESH_ENV: "tensor=two"}, "TFDIST_MESH does not name a mesh"),
    ({MESH_ENV: "model=2"}, "Expected: 'data=D,pipe=K,tensor=T'"),
    ({MESH_ENV: "tensor=0"}, "tensor=0"),
    ({"TF_CONFIG": '{"cluster": {"worker": ["h:1"], "ps": ["h:2"]}, '
                   '"task": {"type": "ps", "index": 0}}'}, "This task is not on the job's mesh"),
])
def test_from_environment_refuses_what_it_cannot_read(environ, fragment):
    with pytest.raises(StrategyConfigError) as err:
        Mesh.from_environment(environ)
    assert fragment in str(err.value)


def test_ray_spreading_a_tensor_group_is_warned_about(capsys, script):
    argv = ["--dry-run", "--strategy", SPLIT, "--workers", "4", "--tensor", "2", "--ray",
            "local", script]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "warning: --ray-placement SPREAD may put the 2 processes of a tensor group" in err
    assert "Fix: --ray-placement PACK" in err
    assert cli.main([*argv[:-1], "--ray-placement", "PACK", script]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_stale_tensor_shards_variable_in_the_shell_changes_nothing():
    # TFDIST_TENSOR_SHARDS=1 left in the shell once made --strategy tensor --workers 2 data
    # parallel: the launcher writes T in the mesh, and a task reads the mesh first
    from tfdist.parallel.place import process_place

    stale = {"TFDIST_TENSOR_SHARDS": "1"}
    plan = plan_job(JobOptions("t.py", strategy="tensor", workers=2), environ=stale)
    assert plan.env[MESH_ENV] == "data=1,pipe=1,tensor=2"
    tf_config = {"cluster": {"worker": ["localhost:1", "localhost:2"]},
                 "task": {"type": "worker", "index": 1}}
    task = process_place(tf_config, default_tensor="all",
                         environ={**stale, MESH_ENV: plan.env[MESH_ENV]})
    assert task.size_of("tensor") == 2 and task.size_of("data") == 1
