"""ZeRO without a cluster: the partition by bytes, the options (stage, D, strategy) refused with
the field, the value and the fix before anything trains, and ``--zero`` reaching the tasks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tfdist.errors import StrategyConfigError
from tfdist.launcher import cli
from tfdist.zero.partition import check_stage, partition, partition_groups

pytestmark = pytest.mark.unit


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('never run')\n")
    return str(path)


@pytest.mark.parametrize("parts", [2, 3, 4])
def test_the_parts_cover_every_row_once_and_are_balanced_within_a_row(parts):
    shapes = [(128, 8), (32, 8), (8,), (), (8, 4), (4,)]
    plan = partition(shapes, itemsize=4, parts=parts)
    for index, shape in enumerate(shapes):
        pieces = plan.of_variable(index)
        rows = shape[0] if shape else 1
        assert [p.start for p in pieces] == [0, *(p.stop for p in pieces[:-1])]
        assert pieces[-1].stop == rows
    owned = plan.owned_bytes()
    assert sum(owned) == plan.total_bytes
    widest_row = max(math.prod(s[1:]) if s else 1 for s in shapes) * 4
    assert max(abs(b - plan.total_bytes / parts) for b in owned) <= widest_row
    assert len(plan.of_variable(0)) > 1  # the large embedding is split across owners


@pytest.mark.parametrize("parts", [2, 3])
def test_stage_three_cuts_each_layer_into_parts_of_its_own(parts):
    # a whole-model cut gives the first layer to one owner: gathering it would move as many
    # bytes of padding; cut per layer, every owner holds about 1/D of each layer
    shapes = [(16, 16), (16,), (64, 16), (16,), (16, 2), (2,)]
    groups = [[0, 1], [2, 3], [4, 5]]
    plan = partition_groups(shapes, groups, itemsize=4, parts=parts)
    assert len(partition(shapes, 4, parts).of_variable(0)) == 1
    for group in groups:
        owned = [sum(p.size for p in plan.of_owner(d) if p.variable in group) * 4
                 for d in range(parts)]
        total = sum(math.prod(shapes[i]) for i in group) * 4
        assert sum(owned) == total
        assert max(abs(b - total / parts) for b in owned) <= 16 * 4  # within one row
    for index, shape in enumerate(shapes):
        pieces = plan.of_variable(index)
        assert [p.start for p in pieces] == [0, *(p.stop for p in pieces[:-1])]
        assert pieces[-1].stop == shape[0]
    with pytest.raises(StrategyConfigError, match="every trainable weight exactly once"):
        partition_groups(shapes, [[0, 1], [2, 3], [4]], itemsize=4, parts=2)


def test_sabotaged_balance_would_be_seen():
    plan = partition([(100, 1)], itemsize=4, parts=2)
    assert plan.owned_bytes() == [200, 200]
    lopsided = partition([(100, 1)], itemsize=4, parts=1).owned_bytes()
    assert lopsided == [400]


@pytest.mark.parametrize("stage", [4, -1, "two", 1.5, True])
def test_an_unknown_stage_is_refused_with_the_fix(stage):
    with pytest.raises(StrategyConfigError) as error:
        check_stage(stage)
    message = str(error.value)
    assert f"zero={stage!r}" in message and "Fix: pass zero=1, 2 or 3" in message


def test_a_shape_that_is_not_known_is_refused_by_name():
    with pytest.raises(StrategyConfigError, match=r"trainable weight 1 of shape \(None, 3\)"):
        partition([(2, 3), (None, 3)], itemsize=4, parts=2)


def test_weights_of_two_dtypes_are_refused_naming_the_odd_one():
    import keras

    from tfdist.zero.engine import check_partitionable

    odd = keras.Variable([1, 2], dtype="int32", name="steps")
    with pytest.raises(StrategyConfigError) as error:
        check_partitionable([keras.Variable([1.0], name="kernel"), odd])
    assert "steps: int32" in str(error.value) and "Fix:" in str(error.value)
    with pytest.raises(StrategyConfigError, match="0 trainable weights"):
        check_partitionable([])


def test_get_strategy_refuses_zero_on_one_process_and_where_it_does_not_apply(monkeypatch):
    from tfdist import get_strategy

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TFDIST_ZERO", raising=False)
    with pytest.raises(StrategyConfigError) as error:
        get_strategy("multi_worker", zero=2)
    assert "zero=2 with D=1" in str(error.value) and "--workers 2" in str(error.value)
    with pytest.raises(StrategyConfigError, match="zero=2 with implementation"):
        get_strategy("multi_worker", zero=2, implementation="ring")
    for name in ("parameter_server", "horovod"):
        with pytest.raises(StrategyConfigError, match=r"Unknown option\(s\).*zero=1"):
            get_strategy(name, zero=1)
    monkeypatch.setenv("TFDIST_ZERO", "7")
    with pytest.raises(StrategyConfigError, match="TFDIST_ZERO='7'"):
        get_strategy("multi_worker")


def test_zero_reaches_every_task_of_a_multi_worker_job(script, capsys):
    assert cli.main(["--dry-run", "--zero", "3", "--workers", "2", script]) == 0
    tasks = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [t["env"]["TFDIST_STRATEGY"] for t in tasks] == ["multi_worker"] * 2
    assert [t["env"]["TFDIST_ZERO"] for t in tasks] == ["3", "3"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--zero", "2", "--strategy", "horovod", "--workers", "2"],
     "--zero was given with --strategy horovod, which does not take it"),
    (["--zero", "2", "--strategy", "parameter_server", "--ps", "1", "--workers", "2"],
     "--zero was given with --strategy parameter_server"),
    (["--zero", "1", "--strategy", "mirrored"],
     "Fix: drop --zero, or use --strategy multi_worker"),
    (["--zero", "1", "--strategy", "multi_worker", "--workers", "1"],
     "--zero 1 with 1 training process (D=1)"),
    (["--zero", "4", "--workers", "2"], "invalid choice: 4"),
])
def test_bad_zero_options_are_refused_before_start(script, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--dry-run", *argv, script])
    assert exit_info.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message in err
    assert "Fix:" in err or "invalid choice" in err


def test_a_backup_of_another_data_size_or_stage_is_refused(tmp_path):
    from tfdist.resilience.claim import claim_backup
    from tfdist.strategies.zero import ZeroStrategy

    class Written:  # the layout a ZeroStrategy records, without a cluster
        per_rank_backups, worker_index, is_chief, name = True, 0, True, "multi_worker"

        def __init__(self, stage, data):
            self.stage, self.num_replicas = stage, data

        backup_layout = ZeroStrategy.backup_layout

    claim_backup(Written(2, 2), str(tmp_path / "rank-0"), str(tmp_path))
    for stage, data in ((2, 3), (3, 2)):
        with pytest.raises(StrategyConfigError) as error:
            claim_backup(Written(stage, data), str(tmp_path / "rank-0"), str(tmp_path))
        message = str(error.value)
        assert '"data": 2' in message and f'"zero": {stage}' in message
        assert "Fix: resume with the layout it was written for (--strategy multi_worker " \
            "--workers 2 --zero 2)" in message


def test_the_advisor_offers_a_zero_stage_where_replicated_does_not_fit():
    from tfdist.advise import network
    from tfdist.advise.advisor import advise
    from tfdist.advise.candidates import Cluster
    from tfdist.advise.cli import parse_args
    from tfdist.advise.curve import Line
    from tfdist.advise.model import Link
    from tfdist.advise.profile import ModelProfile

    assert parse_args(["json:loads", "--memory-per-process", "150MB"]).device_memory == 150e6
    prof = ModelProfile(
        names=("a", "b"), params=(1, 1), param_bytes=(24_000_000,) * 2,
        activation_bytes=(4000, 400), forward=(Line(0, 1e-5),) * 2,
        backward=(Line(0, 2e-5),) * 2, step=Line(0.002, 1e-4), optimizer_slots=2,
        embeddings=(), threads=1, batch=64)
    link = Link(alpha=1e-4, beta=1 / 2e9, gamma=0.0)
    net = network.Constants(link, {"tf": link, "horovod": link}, 2e-10, 2, {}, {})
    report = advise(None, Cluster(8, device_memory=150e6), batch=64, constants=net,
                    profile=prof)
    replicated = report.prediction("multi_worker x8")
    assert not replicated.fits and replicated.memory_bytes >= 4 * 48e6   # weights, grads, Adam
    stage2 = report.prediction("multi_worker x8 zero=2")
    assert stage2.fits
    # 2 x 48 MB (weights, own gradients) + 1/8 summed + 1/8 of weights and Adam's slots
    assert stage2.memory_bytes == pytest.approx(96e6 + 6e6 + 18e6, rel=1e-3)
    assert stage2.candidate.launch_argv()[-3:] == ["--zero", "2", "train.py"]
    stage1 = report.prediction("multi_worker x8 zero=1")
    assert stage1.step_s > stage2.step_s   # it all-reduces: the gradients' bytes twice over


def test_a_model_with_fewer_rows_than_processes_is_refused():
    from tfdist.zero.engine import _refuse_empty_parts

    plan = partition([(1, 8)], itemsize=4, parts=2)
    with pytest.raises(StrategyConfigError) as error:
        _refuse_empty_parts(plan, ["kernel"])
    message = str(error.value)
    assert "1 rows in all, D=2 (processes [1] would own nothing)" in message
    assert "Fix: use fewer processes" in message


def test_tf_keras_is_refused_with_the_fix_before_any_cluster(monkeypatch):
    from tfdist.errors import KerasCompatibilityError
    from tfdist.strategies import zero

    monkeypatch.setattr(zero, "keras_flavour", lambda: "tf_keras")
    with pytest.raises(KerasCompatibilityError) as error:
        zero.ZeroStrategy(2)
    assert "zero=2 with tf-keras" in str(error.value)
    assert "Fix: unset TF_USE_LEGACY_KERAS" in str(error.value)
