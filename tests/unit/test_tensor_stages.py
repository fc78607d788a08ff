"""Tensor-split pipeline stages in one process: the plan of a pipeline's model (the output kept
whole), the refusals before training (a cut carrying a column-split output, a rule asking for
the vocabulary-split output, norm clipping, tf-keras, local devices, more shards than processes),
a stage's shard built from the layers' configs with only its variables, and the weights sliced
and gathered back (a group of one)."""

from __future__ import annotations

import doctest

import keras
import numpy as np
import pytest

from tfdist.errors import StrategyConfigError
from tfdist.parallel.mesh import Mesh, ProcessGroup
from tfdist.pipeline import stage
from tfdist.tensor import layers as split
from tfdist.tensor import stages as tensor_stages
from tfdist.tensor.stages import StageSplit, check_clipping, check_cuts, plan_stages, stage_split

pytestmark = pytest.mark.unit


def tiny_lm():
    layers = keras.layers
    tokens = keras.Input((6,), dtype="int32", name="tokens")
    x = layers.Embedding(16, 8, name="emb")(tokens)
    for b in range(2):
        h = layers.LayerNormalization(name=f"b{b}_ln")(x)
        x = layers.Add(name=f"b{b}_add")([x, layers.MultiHeadAttention(4, 2, name=f"b{b}_attn")(
            h, h)])
        h = layers.Dense(32, activation="relu", name=f"b{b}_up")(x)
        x = layers.Add(name=f"b{b}_add2")([x, layers.Dense(8, name=f"b{b}_down")(h)])
    return keras.Model(tokens, layers.Dense(16, name="head")(x), name="lm")


def test_docstring_examples_run(monkeypatch):
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    result = doctest.testmod(tensor_stages, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_the_plan_splits_every_block_and_keeps_the_output_whole():
    plan = plan_stages(tiny_lm(), shards=2)
    kinds = {layer.name: layer.kind for layer in plan.layers}
    assert kinds["emb"] == "vocab" and kinds["b1_attn"] == "heads"
    assert (kinds["b0_up"], kinds["b0_down"]) == ("column", "row")
    head = plan.layer("head")
    assert head.kind == "replicated" and "whole logits" in head.reason
    assert all(w.axis is None for w in head.weights)


def test_a_rule_asking_for_the_vocabulary_split_output_is_refused():
    with pytest.raises(StrategyConfigError) as err:
        plan_stages(tiny_lm(), 2, rules={"head": "output"})
    message = str(err.value)
    assert "'head' cannot be split by vocabulary in a pipeline" in message
    assert "Received: rules: 'head' -> 'output'" in message
    assert "Fix: drop that rule, or use rules={'head': 'replicated'}" in message


def test_a_cut_between_a_column_layer_and_its_row_partner_is_refused():
    model = tiny_lm()
    plan = plan_stages(model, 2)
    spec, bounds = stage.split_model(model, 2, split_points=["b0_down"])
    with pytest.raises(StrategyConfigError) as err:
        check_cuts(spec, bounds, plan)
    message = str(err.value)
    assert "would carry the output of layer 'b0_up' (column)" in message
    assert "Received: split_points / stage 1 starting at 'b0_down'" in message
    assert "Fix: move the split point before 'b0_up' or after its partner" in message
    spec, bounds = stage.split_model(model, 2, split_points=["b1_ln"])
    check_cuts(spec, bounds, plan)  # between blocks: whole activations


@pytest.mark.parametrize("option", ["clipnorm", "global_clipnorm"])
def test_norm_clipping_is_refused(option):
    with pytest.raises(StrategyConfigError) as err:
        check_clipping(keras.optimizers.Adam(**{option: 1.0}))
    assert f"Received: {option}=1.0" in str(err.value)
    assert f"Fix: drop {option} (clipvalue is exact)" in str(err.value)
    check_clipping(keras.optimizers.Adam(clipvalue=1.0))


def test_a_tf_keras_model_is_refused():
    spec, bounds = stage.split_model(tiny_lm(), 2, split_points=["b1_ln"])
    legacy = type(spec)(**{**spec.__dict__, "flavour": "tf_keras"})
    with pytest.raises(StrategyConfigError, match="need Keras 3.*Fix: unset TF_USE_LEGACY_KERAS"):
        stage_split(legacy, bounds, {}, ProcessGroup(key=1, members=(0, 1), rank=0))


def test_a_stage_is_built_of_its_shards_only():
    model = tiny_lm()
    spec, bounds = stage.split_model(model, 2, split_points=["b1_ln"])
    group = ProcessGroup(key=1, members=(0, 1), rank=1)  # shard 1 of 2; built, never run
    splits = stage_split(spec, bounds, {}, group)
    built = stage.build_stage(spec, bounds, 1, layer_maker=splits.layer_maker)
    assert isinstance(built.get_layer("b1_attn"), split.HeadsAttention)
    assert isinstance(built.get_layer("b1_up"), split.ColumnDense)
    assert isinstance(built.get_layer("b1_down"), split.RowDense)
    assert type(built.get_layer("head")) is keras.layers.Dense
    assert built.get_layer("b1_up").kernel.shape == (8, 16)
    whole = sum(model.get_layer(name).count_params()
                for name in ("b1_ln", "b1_attn", "b1_up", "b1_down", "head"))
    held = built.count_params()
    assert held < 0.75 * whole
    ids = stage.stage_layers(spec, bounds, 1)
    splits.set_weights(built, spec, ids, stage.stage_weights(model, spec, bounds, 1))
    np.testing.assert_array_equal(built.get_layer("b1_up").kernel.numpy(),
                                  model.get_layer("b1_up").kernel.numpy()[:, 16:])
    np.testing.assert_array_equal(built.get_layer("head").kernel.numpy(),
                                  model.get_layer("head").kernel.numpy())


def test_a_group_of_one_gathers_its_stage_whole():
    model = tiny_lm()
    spec, bounds = stage.split_model(model, 2, split_points=["b1_ln"])
    one = StageSplit(plan_stages(model, 1), Mesh().group("tensor", 0), 30.0)
    built = stage.build_stage(spec, bounds, 0, layer_maker=one.layer_maker)
    ids = stage.owned_layers(spec, bounds, 0)
    one.set_weights(built, spec, ids, stage.layer_weights(model, spec, ids))
    for got, want in zip(one.gather(built, spec, ids), stage.layer_weights(model, spec, ids),
                         strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_split_stage_is_never_held_by_the_devices_of_one_process():
    from tfdist.pipeline.config import PipelineConfig
    from tfdist.pipeline.modes import choose_mode

    config = PipelineConfig(stages=2, devices=("/cpu:0", "/cpu:1"))
    with pytest.raises(StrategyConfigError) as err:
        choose_mode(config, processes=4, rank=0, tensor=2)
    assert "Received: devices=['/cpu:0', '/cpu:1'], tensor=2" in str(err.value)
    mode = choose_mode(PipelineConfig(stages=2), processes=4, rank=3, tensor=2)
    assert mode.layout.coordinates == (0, 1, 1) and mode.layout.previous == 1


def test_one_process_cannot_hold_two_shards(monkeypatch):
    from tfdist.strategies.pipeline import PipelineStrategy

    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(StrategyConfigError, match="tensor=2"):
        PipelineStrategy(tensor=2)
    monkeypatch.setenv("TFDIST_TENSOR_SHARDS", "x")
    with pytest.raises(StrategyConfigError, match="positive int.*TFDIST_TENSOR_SHARDS=T"):
        PipelineStrategy()
