"""K x T on a KerasHub model, in one process: the tensor plan of a pipeline's stages splits
inside GPT-2's Transformer blocks (attention by heads, the feed-forward pair by columns and
rows), each block passes the whole-vs-split check, and the tied embedding is split by
vocabulary rows in both stages that hold it (the last stage gathers its logits whole for the
loss).

Measured on the small config below (vocabulary 64, width 32, 2 blocks, K=2 cut after block 0):
the stages' plan splits 75,008 of 78,848 weight bytes (95.1%; 66,816, 84.7%, while the tied
embedding stayed whole). Per stage: each block 98.5% split (its two LayerNormalizations stay
whole); stage 0 94.2% of its weight bytes (the position embedding, 2,048 B, stays whole), stage
1 98.2% (the final LayerNormalization whole).
"""

from __future__ import annotations

import pytest

from tfdist.compat import models as keras_compat
from tfdist.pipeline import stage
from tfdist.tensor.blocks import checked_plan
from tfdist.tensor.check import TOLERANCE
from tfdist.tensor.stages import StageSplit, plan_stage_units, plan_stages


def gpt2():
    import keras

    # imported here, not while collecting: 1.5 CPU-s a pytest-xdist worker running none of
    # these tests no longer pays
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(1)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=64, num_layers=2, hidden_dim=32, num_heads=2, intermediate_dim=64,
        max_sequence_length=16, dropout=0.0)
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


@pytest.fixture(scope="module")
def split_gpt2():
    spec, bounds = stage.split_model(gpt2(), 2, 2)
    with keras_compat.abstract_build():
        whole = stage.assemble(spec)
    return spec, bounds, plan_stages(whole, 2)


def _bytes(layer):
    return sum(w.whole_bytes for w in layer.weights)


def _stage_share(spec, bounds, plan, k):
    names = {spec.layers[lid].name for lid in stage.stage_layers(spec, bounds, k)}
    inside = StageSplit(plan, None, 1.0).of_layers(sorted(names)).layers
    whole = sum(_bytes(layer) for layer in inside)
    split = sum(_bytes(layer) for layer in inside if layer.split)
    return split / whole, whole


def test_stage_plan_splits_gpt2_blocks_by_heads_and_feed_forward(split_gpt2):
    spec, bounds, plan = split_gpt2
    assert [spec.names[b] for b in bounds[:-1]] == ["token_embedding", "transformer_layer_1"]
    kinds = {layer.name: layer.kind for layer in plan.layers}
    for block in ("transformer_layer_0", "transformer_layer_1"):
        for part in ("query", "key", "value"):
            assert kinds[f"{block}/self_attention/{part}"] == "column"
        assert kinds[f"{block}/self_attention/attention_output"] == "row"
        assert kinds[f"{block}/feedforward_intermediate_dense"] == "column"
        assert kinds[f"{block}/feedforward_output_dense"] == "row"
        blocks = [layer for layer in plan.layers if layer.name.startswith(block + "/")]
        share = sum(_bytes(b) for b in blocks if b.split) / sum(_bytes(b) for b in blocks)
        assert share >= 0.95, (block, share)
        assert share == pytest.approx(33664 / 34176)
    # the tied embedding split by vocabulary rows: the last stage gathers its logits whole
    assert kinds["token_embedding"] == "tied"
    assert "gathered whole" in plan.layer("token_embedding").reason
    assert plan.split_bytes == 75008 and plan.whole_bytes == 78848
    assert plan.split_bytes >= 0.95 * plan.whole_bytes


def test_each_stage_share_and_bytes_per_process(split_gpt2):
    spec, bounds, plan = split_gpt2
    shares = [_stage_share(spec, bounds, plan, k) for k in range(2)]
    # stage 0: embeddings (10,240 B whole) + block 0; stage 1: block 1 + final norm + tied emb
    assert shares[0][1] == 8192 + 2048 + 34176
    assert shares[1][1] == 34176 + 256 + 8192
    assert shares[0][0] == pytest.approx((33664 + 8192) / 44416)  # 94.2%: position emb whole
    assert shares[1][0] == pytest.approx((33664 + 8192) / 42624)  # 98.2%
    assert plan.bytes_per_process / plan.whole_bytes < 0.53


def test_every_block_passes_the_whole_versus_split_check():
    spec, _ = stage.split_model(gpt2(), 2, 2)
    whole = stage.assemble(spec)  # drawn weights: the check runs blocks whole and split
    plan, units = plan_stage_units(whole, 2)
    assert {u.block for u in units} == {"transformer_layer_0", "transformer_layer_1"}
    assert {u.kind for u in units} == {"attention", "feed-forward"}  # no embedding unit
    checked, kept, gaps = checked_plan(whole, plan, units)
    assert set(gaps) == {"transformer_layer_0", "transformer_layer_1"}
    assert all(gap <= TOLERANCE for gap in gaps.values()), gaps
    assert kept == units and checked.split_bytes == plan.split_bytes
    assert "block checked" in checked.layer("transformer_layer_0/self_attention/query").reason


def _stage_shard(model, spec, bounds, plan, units, rank):
    import tensorflow as tf

    from tfdist.parallel.mesh import ProcessGroup

    split = StageSplit(plan, ProcessGroup(key=7, members=(0, 1), rank=rank), 5.0, units)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        shard = stage.build_stage(spec, bounds, 0, layer_maker=split.layer_maker)
    ids = stage.stage_layers(spec, bounds, 0)
    split.set_weights(shard, spec, ids, stage.stage_weights(model, spec, bounds, 0))
    split.shard_blocks(shard, spec, ids)
    return split, shard, ids, strategy


def test_a_stage_shard_holds_its_slices_and_its_plan_bytes():
    """Sharding a stage's blocks in place (no collective runs here: the shards' calls are only
    wrapped): each shard holds its heads and columns, the two shards' slices make the whole
    weight, the bytes held are the plan's, and Adam builds its slots in the stage's scope."""
    import keras
    import numpy as np

    model = gpt2()
    spec, bounds = stage.split_model(model, 2, 2)
    plan, units = plan_stage_units(stage.assemble(spec), 2)
    shards = [_stage_shard(model, spec, bounds, plan, units, rank) for rank in (0, 1)]
    whole_block = model.backbone.get_layer("transformer_layer_0")
    for split, shard, ids, strategy in shards:
        held = sum(np.asarray(w).nbytes for w in shard.get_weights())
        assert held == sum(split.held_bytes(spec.layers[i].name, spec.layers[i].param_bytes)
                           for i in ids) == 23616  # of 44,416 B for the stage whole
        with strategy.scope():
            optimizer = keras.optimizers.Adam()
            optimizer.build(shard.trainable_variables)
    for part, axis in (("_self_attention_layer._query_dense", 1),
                       ("_feedforward_intermediate_dense", 1),
                       ("_feedforward_output_dense", 0)):
        def kernel(block, part=part):
            for name in part.split("."):
                block = getattr(block, name)
            return block.kernel.numpy()

        halves = [kernel(shard.get_layer("transformer_layer_0")) for _, shard, _, _ in shards]
        assert halves[0].shape[axis] * 2 == kernel(whole_block).shape[axis]
        np.testing.assert_array_equal(np.concatenate(halves, axis=axis), kernel(whole_block))
