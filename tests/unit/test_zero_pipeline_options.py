"""ZeRO on the data axis of the pipeline and tensor strategies without a cluster: ``--zero 1|2``
reaching their tasks, and what they cannot run (D=1, the pipeline's tensor-split
stages, options Keras keeps per variable, tied weights under stage 2) refused before anything
starts with the field, the value and the fix (stage 3: the pipeline options it cannot run
layer by layer); a backup written with ZeRO refused by a job
without it. The training itself is tested on 4 processes in
``tests/multiprocess/test_zero_pipeline.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tfdist.errors import StrategyConfigError
from tfdist.launcher import cli
from tfdist.zero.data_axis import check_zero, check_zero_optimizer

pytestmark = pytest.mark.unit


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('never run')\n")
    return str(path)


@pytest.mark.parametrize("split", [["--stages", "2"], ["--tensor", "2"]])
def test_zero_reaches_every_task_of_a_pipeline_or_tensor_job(script, capsys, split):
    strategy = "pipeline" if "--stages" in split else "tensor"
    argv = ["--dry-run", "--strategy", strategy, *split, "--workers", "4", "--zero", "2", script]
    assert cli.main(argv) == 0
    tasks = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [t["env"]["TFDIST_ZERO"] for t in tasks] == ["2"] * 4


@pytest.mark.parametrize(("argv", "message"), [
    (["pipeline", "--zero", "1", "--stages", "2", "--workers", "2"],
     "--zero 1 with 2 process(es) and --stages 2 (D=1)"),
    (["tensor", "--zero", "1", "--workers", "2"],  # T defaults to every process
     "--zero 1 with 2 process(es) and --tensor 2 (D=1)"),
    (["pipeline", "--zero", "2", "--stages", "2", "--tensor", "2", "--workers", "8"],
     "--zero 2 with --tensor 2: ZeRO on the pipeline's data axis is not built for"),
])
def test_what_cannot_be_sharded_is_refused_before_start(script, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--dry-run", "--strategy", *argv, script])
    assert exit_info.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert message in err and "Fix:" in err


def test_the_strategy_refuses_before_joining(monkeypatch):
    from tfdist import get_strategy

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TFDIST_ZERO", raising=False)
    with pytest.raises(StrategyConfigError, match=r"zero=3 with D=1 pipeline replica"):
        get_strategy("pipeline", zero=3)  # stage 3 runs on the pipeline; D=1 does not
    monkeypatch.setenv("TFDIST_ZERO", "1")  # as tfdist-launch --zero 1 writes it
    with pytest.raises(StrategyConfigError) as error:
        get_strategy("pipeline")
    assert "zero=1 with D=1 pipeline replica(s)" in str(error.value)
    assert "Fix: launch with twice the workers" in str(error.value)
    with pytest.raises(StrategyConfigError, match="zero=1 with D=1 tensor replica"):
        get_strategy("tensor")
    monkeypatch.delenv("TFDIST_ZERO")
    with pytest.raises(StrategyConfigError, match="zero=3 with D=1 tensor replica"):
        get_strategy("tensor", zero=3)


@pytest.mark.parametrize(("stage", "replicas", "tensor", "flavour", "message"), [
    (2, 2, 2, "keras3", "zero=2 with tensor=2"),
    (1, 2, 1, "tf_keras", "zero=1 with tf-keras"),
])
def test_check_zero_names_what_it_refuses(stage, replicas, tensor, flavour, message):
    with pytest.raises(StrategyConfigError) as error:
        check_zero(stage, replicas, tensor, flavour)
    assert message in str(error.value) and "Fix:" in str(error.value)


def test_optimizer_state_kept_per_variable_and_tied_weights_under_stage_two_are_refused():
    import keras

    for option, value in (("use_ema", True), ("gradient_accumulation_steps", 2)):
        with pytest.raises(StrategyConfigError) as error:
            check_zero_optimizer(keras.optimizers.Adam(**{option: value}), 1, tied=False)
        assert f"{option}={value!r}" in str(error.value) and "Fix: drop" in str(error.value)
    check_zero_optimizer(keras.optimizers.Adam(clipnorm=1.0), 1, tied=True)  # stage 1: whole
    for stage in (2, 3):
        with pytest.raises(StrategyConfigError,
                           match=f"zero={stage} with weights tied.*Fix: use zero=1"):
            check_zero_optimizer(keras.optimizers.Adam(), stage, tied=True)


@pytest.mark.parametrize("split", [["--strategy", "pipeline", "--stages", "2"],
                                   ["--strategy", "tensor", "--tensor", "2"]])
def test_the_launch_of_stage_three_on_a_data_axis_is_accepted(script, capsys, split):
    argv = ["--dry-run", *split, "--workers", "4", "--zero", "3", script]
    assert cli.main(argv) == 0
    tasks = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [t["env"]["TFDIST_ZERO"] for t in tasks] == ["3"] * 4


@pytest.mark.parametrize(("options", "message"), [
    (("zb-h1", 1, "sum", False), "zero=3 with schedule='zb-h1'"),
    (("interleaved", 2, "sum", False), "zero=3 with chunks=2"),
    (("gpipe", 1, "sum", True), "every stage in one process"),
    (("1f1b", 1, "whole_batch", False), "zero=3 with weight_gradients='whole_batch'"),
])
def test_what_pipeline_stage_three_cannot_run_is_refused(options, message):
    from tfdist.zero.data_axis_layers import check_pipeline_stage3

    with pytest.raises(StrategyConfigError) as error:
        check_pipeline_stage3(*options[:3], holds_several=options[3])
    assert message in str(error.value) and "Fix:" in str(error.value)


def test_stage_three_refuses_weight_regularizers_and_weightless_stages():
    import keras

    from tfdist.parallel.mesh import ProcessGroup
    from tfdist.zero.data_axis_layers import DataAxisLayers

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(
        2, kernel_regularizer=keras.regularizers.L2(0.1), name="d")])
    group = ProcessGroup(key=1, members=(0, 1), rank=0)
    with pytest.raises(StrategyConfigError, match=r"d.kernel_regularizer.*Fix: drop"):
        DataAxisLayers(model, group)
    weightless = keras.Sequential([keras.Input((2, 2)), keras.layers.Flatten()], name="flat")
    with pytest.raises(StrategyConfigError, match=r"'flat' with 0 trainable weights.*Fix: "
                       "move the split points"):
        DataAxisLayers(weightless, group)


def test_a_backup_written_with_zero_is_refused_without_it(tmp_path, monkeypatch):
    from tfdist.resilience.claim import claim_backup
    from tfdist.strategies.pipeline import PipelineStrategy

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TFDIST_ZERO", raising=False)
    strategy = PipelineStrategy()
    assert strategy.backup_layout()["zero"] == 0
    strategy.zero = 1  # the layout a ZeRO job records (its slots: its part of its stage's)
    claim_backup(strategy, str(tmp_path / "rank-0"), str(tmp_path))
    strategy.zero = 0
    with pytest.raises(StrategyConfigError) as error:
        claim_backup(strategy, str(tmp_path / "rank-0"), str(tmp_path))
    assert "zero=1 (now 0)" in str(error.value) and "Fix:" in str(error.value)


def _adam(keras, clip):
    return keras.optimizers.Adam(0.05, **{clip: 0.05})


@pytest.mark.parametrize("clip", ["global_clipnorm", "clipnorm"])
def test_the_step_on_one_replica_is_keras_s_own(clip):
    """D=1 (the collectives are the identity): the pieces are the whole weights, and the step
    (its norms, an embedding's row slices, the gather back) updates them as Keras's Adam
    updates the weights themselves."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tfdist.parallel.mesh import Mesh
    from tfdist.zero.data_axis import DataAxisZero

    rng = np.random.default_rng(0)
    values = [rng.normal(size=(6, 3)).astype("float32"), rng.normal(size=(3,)).astype("float32")]
    ours = [keras.Variable(v) for v in values]
    theirs = [keras.Variable(v) for v in values]
    zero = DataAxisZero(ours, 2, Mesh().group("data", 0), pipe=Mesh().group("pipe", 0))
    assert [tuple(p.shape) for p in zero.pieces] == [(6, 3), (3,)]
    optimizer, reference = _adam(keras, clip), _adam(keras, clip)
    zero.build_optimizer(optimizer, tf.distribute.get_strategy())
    reference.build(theirs)
    for step in range(3):
        grads = [tf.IndexedSlices(tf.constant(rng.normal(size=(4, 3)), tf.float32),
                                  tf.constant([0, 2, 2, 5 - step]), tf.constant([6, 3])),
                 tf.constant(rng.normal(size=(3,)), tf.float32)]
        zero.apply(optimizer, grads, average=list)
        reference.apply_gradients(zip(grads, theirs, strict=True))
    for got, want in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=1e-6)
    assert float(np.max(np.abs(ours[0].numpy() - values[0]))) > 1e-2


def test_a_weightless_stage_takes_part_without_weights():
    import keras
    import tensorflow as tf

    from tfdist.parallel.mesh import Mesh
    from tfdist.zero.data_axis import DataAxisZero

    zero = DataAxisZero([], 2, Mesh().group("data", 0), pipe=Mesh().group("pipe", 0))
    assert zero.pieces == [] and zero.longest == 0
    for clip in ("global_clipnorm", "clipnorm"):
        optimizer = _adam(keras, clip)
        zero.build_optimizer(optimizer, tf.distribute.get_strategy())
        zero.apply(optimizer, [], average=list)
        assert int(optimizer.iterations.numpy()) == 1  # the step counted, as on the others


@pytest.mark.parametrize("name", ["pipeline", "tensor"])
def test_a_backup_under_stage_three_is_made(tmp_path, monkeypatch, name):
    """Stage 3's per-process backups (its pieces; what they restore is checked on 4
    processes in ``tests/multiprocess/test_zero_pipeline.py``) are no longer refused."""
    from tfdist.strategies.pipeline import PipelineStrategy
    from tfdist.strategies.tensor import TensorStrategy

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TFDIST_ZERO", raising=False)
    strategy = PipelineStrategy() if name == "pipeline" else TensorStrategy()
    strategy.zero = 3  # as a D=2 job at stage 3 has it
    assert strategy.backup_callback(str(tmp_path)) is not None


def test_a_stage_three_backup_holds_the_pieces_not_the_empty_model(tmp_path):
    """The rank's checkpoint under stage 3 (D=1 here, no collective): this process's pieces,
    the model's other variables (a BatchNormalization's statistics) and the optimizer, not the
    stage model (its trainable variables hold no values); a restore puts them back."""
    import keras
    import numpy as np

    from tfdist.parallel.mesh import Mesh
    from tfdist.resilience.pipeline_backup import backup_objects
    from tfdist.resilience.pipeline_vote import StepCheckpoint
    from tfdist.zero.data_axis_layers import DataAxisLayers

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3, name="a"),
                              keras.layers.BatchNormalization(name="bn")])
    zero = DataAxisLayers(model, Mesh().group("data", 0))
    model._pipeline_zero = zero  # noqa: SLF001 - as the pipeline strategy attaches it
    model.compile(optimizer="adam", loss="mse")
    objects = backup_objects(model)
    assert sorted(objects) == ["optimizer", "zero_pieces", "zero_state"]
    assert objects["zero_pieces"] == zero.pieces and len(objects["zero_state"]) == 2
    assert all(v._value is None for v in model.trainable_variables)  # noqa: SLF001
    saved = [np.array(v.numpy()) for v in zero.pieces + model.non_trainable_variables]
    saver = StepCheckpoint(str(tmp_path), **objects)
    saver.save(7)
    for variable in zero.pieces + model.non_trainable_variables:
        variable.assign(np.full(variable.shape, 9.0, "float32"))
    assert StepCheckpoint(str(tmp_path), **backup_objects(model)).restore() == 7
    for variable, value in zip(zero.pieces + model.non_trainable_variables, saved, strict=True):
        np.testing.assert_array_equal(variable.numpy(), value)


def test_a_custom_loop_checkpoint_of_a_stage3_model_is_refused_with_its_objects_named():
    """The custom loop's ``preemption_handler`` at stage 3: a ``tf.train.Checkpoint`` of the
    stage model is refused when the handler is made (it failed at the first save); the fix's
    ``backup_objects`` gives the pieces, the optimizer and the model's other variables."""
    import keras
    import tensorflow as tf

    from tfdist.resilience.pipeline_backup import StepBackupMixin, backup_objects
    from tfdist.zero.data_axis_layers import DataAxisLayers

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    zero = DataAxisLayers.__new__(DataAxisLayers)  # what attach_data_axis leaves on the model
    zero.pieces = [tf.Variable([1.0])]
    model.zero = zero
    optimizer = keras.optimizers.Adam()
    with pytest.raises(StrategyConfigError) as refused:
        StepBackupMixin.preemption_handler(None, tf.train.Checkpoint(
            step=tf.Variable(0), model=model, optimizer=optimizer), "/nonexistent")
    message = str(refused.value)
    assert "model=<Sequential under zero=3>" in message
    assert "strategy.backup_objects(model, optimizer)" in message
    objects = backup_objects(model, optimizer)
    assert sorted(objects) == ["optimizer", "zero_pieces", "zero_state"]
    assert objects["zero_pieces"] == zero.pieces
    del model.zero  # the same model without ZeRO: checkpointed whole
    assert sorted(backup_objects(model, optimizer)) == ["model", "optimizer"]
