"""The advisor with tensor parallelism: D x K x T candidates, the activation all-reduce term and
weight bytes per process, checked by hand on a stated model."""

from __future__ import annotations

import pytest

from tfdist.advise import model, network
from tfdist.advise.advisor import advise
from tfdist.advise.candidates import Candidate, Cluster, candidates, tensor_sizes
from tfdist.advise.model import Link
from tfdist.advise.predict import predict
from tfdist.advise.profile import Line, ModelProfile, tensor_parts
from tfdist.core.registry import register, unregister
from tfdist.core.traits import StrategyTraits

pytestmark = pytest.mark.unit

LINK = Link(alpha=1e-4, beta=1e-9, gamma=0.0)
SEQ_HIDDEN = 16 * 128 * 4  # one sample's block activation: seq 16 x hidden 128 x float32

# The stated model: embedding, one attention block (its four all-reduces, two forward and two
# backward, counted at "att"), a feed-forward, a vocabulary projection. Each layer: 1e-5 s
# forward, 2e-5 s backward per sample; the step 1.5e-4 s per sample (so 3e-5 s per sample
# beyond the layers).
PROFILE = ModelProfile(
    names=("emb", "att", "ffn", "out"), params=(100_000, 250_000, 500_000, 100_000),
    param_bytes=(400_000, 1_000_000, 2_000_000, 400_000),
    activation_bytes=(SEQ_HIDDEN, SEQ_HIDDEN, SEQ_HIDDEN, 40_000),
    forward=(Line(0, 1e-5),) * 4, backward=(Line(0, 2e-5),) * 4, step=Line(0, 1.5e-4),
    optimizer_slots=2, embeddings=(), threads=1, batch=32,
    split_bytes=(400_000, 960_000, 1_990_000, 400_000),
    reductions=((1, SEQ_HIDDEN),) * 4, heads=4)
# Per shard at T=2: 200_000 + (480_000 + 40_000) + (995_000 + 10_000) + 200_000 bytes.
SHARD_BYTES = 1_925_000


def _ring2(nbytes: float) -> float:
    return 2 * LINK.alpha + nbytes * LINK.beta  # ring all-reduce over 2 processes, gamma 0


def _terms(pred) -> dict[str, float]:
    return {t.kind: t.seconds for t in pred.terms}


def test_weight_bytes_per_shard_are_split_over_t_plus_replicated():
    assert sum(PROFILE.bytes_per_shard(2)) == SHARD_BYTES
    assert PROFILE.bytes_per_shard(1) == tuple(float(b) for b in PROFILE.param_bytes)
    assert model.tensor_weight_bytes(3_750_000, 3_800_000, 2) == SHARD_BYTES


def test_tensor_two_ways_on_two_processes():
    pred = predict(Candidate("tensor", 2, tensor=2), PROFILE, {"tf": LINK}, Cluster(2, cores=2),
                   batch=32)
    terms = _terms(pred)
    assert terms["compute"] == pytest.approx(1.5e-4 * 32 / 2)  # the whole step, halved
    # Two all-reduces forward and two backward of 32 x seq x hidden x 4 bytes, over T=2.
    assert terms["tensor"] == pytest.approx(4 * _ring2(32 * SEQ_HIDDEN))
    assert terms["communication"] == 0.0  # one replica: no gradient all-reduce
    assert pred.step_s == pytest.approx(2.4e-3 + 4 * _ring2(32 * SEQ_HIDDEN))
    activations = (3 * SEQ_HIDDEN + 40_000) * 32
    assert pred.memory_bytes == pytest.approx(SHARD_BYTES * (2 + 2) + activations)
    assert "over T=2" in pred.terms[-1].detail
    assert pred.why().startswith("compute 56%: forward+backward+update of 32 samples, each "
                                 "layer split 2 ways")


def test_data_times_tensor_adds_the_gradient_all_reduce_of_one_shard():
    pred = predict(Candidate("tensor", 4, tensor=2), PROFILE, {"tf": LINK}, Cluster(4, cores=4),
                   batch=32)
    terms = _terms(pred)
    assert pred.candidate.replicas == 2
    assert terms["compute"] == pytest.approx(1.5e-4 * 16 / 2)
    assert terms["tensor"] == pytest.approx(4 * _ring2(16 * SEQ_HIDDEN))
    assert terms["communication"] == pytest.approx(_ring2(SHARD_BYTES))


def test_pipeline_of_tensor_split_stages():
    pred = predict(Candidate("pipeline", 4, stages=2, micro_batches=2, tensor=2), PROFILE,
                   {"tf": LINK}, Cluster(4, cores=4), batch=32)
    terms = _terms(pred)
    micro = 16  # D=1, M=2; balanced stages: [emb, att] | [ffn, out], 4.8e-4 s each, halved
    stage = 2 * 3e-5 * micro / 2
    reduce = 4 * _ring2(micro * SEQ_HIDDEN)  # stage 0 holds the block's all-reduces
    rest = 3e-5 * 32 / (2 * 2)
    assert terms["compute"] == pytest.approx(2 * stage + rest)
    assert terms["tensor"] == pytest.approx(2 * reduce)
    assert terms["bubble"] == pytest.approx(stage + reduce)  # (K-1) slots of the slowest stage
    assert terms["communication"] == 0.0  # transfers hidden behind compute, one replica
    stage1 = (995_000 + 10_000 + 200_000) * 4 + (SEQ_HIDDEN + 40_000) * micro * 2
    assert pred.memory_bytes == pytest.approx(stage1)


def test_without_tensor_the_pipeline_and_its_label_are_unchanged():
    plain = Candidate("pipeline", 4, stages=2, micro_batches=4)
    assert plain.label == "pipeline D=2 x K=2 M=4" and plain.replicas == 2
    assert "tensor" not in _terms(predict(plain, PROFILE, {"tf": LINK}, Cluster(4), 64))


def test_candidates_keep_tensor_groups_on_one_host_and_dividing_the_heads():
    by = {1: "tensor", 2: "pipeline"}
    labels = [c.label for c in candidates(Cluster(4), 64, micro_batches=(4,), heads=4,
                                          tensor_by=by)]
    assert {"tensor D=2 x T=2", "pipeline K=2 x T=2 M=4", "tensor T=4"} <= set(labels)
    two_hosts = [c.label for c in candidates(Cluster(4, hosts=2), 64, micro_batches=(4,),
                                             heads=4, tensor_by=by)]
    assert "tensor T=4" not in two_hosts and "pipeline K=2 x T=2 M=4" in two_hosts
    assert tensor_sizes(Cluster(4), heads=3) == [] and tensor_sizes(Cluster(6), heads=6) == [
        2, 3, 6]
    assert not [c for c in candidates(Cluster(4), 64, heads=4, tensor_by={}) if c.tensor > 1]
    assert Candidate("tensor", 4, tensor=2).launch_argv("t.py") == [
        "tfdist-launch", "--strategy", "tensor", "--workers", "4", "--tensor", "2", "t.py"]


def test_tensor_parts_of_a_transformer_block():
    from tfdist.core import flavour

    keras = flavour.get_keras()
    tokens = keras.Input((8,), dtype="int32")
    x = keras.layers.Embedding(64, 16, name="emb")(tokens)
    att = keras.layers.MultiHeadAttention(4, 4, name="att")(x, x)
    h = keras.layers.LayerNormalization(name="ln")(x + att)
    ffn = keras.layers.Dense(16, name="down")(keras.layers.Dense(32, name="up")(h))
    mdl = keras.Model(tokens, keras.layers.Dense(64, name="out")(ffn))
    layers = [layer for layer in mdl.layers if type(layer).__name__ != "InputLayer"]
    names = [layer.name for layer in layers]
    acts = [8 * 16 * 4] * (len(layers) - 1) + [8 * 64 * 4]  # seq 8 x width 16; x vocab 64
    split, reductions, heads = tensor_parts(layers, acts)
    by_name = dict(zip(names, split, strict=True))
    assert by_name["emb"] == 64 * 16 * 4 and by_name["ln"] == 0
    assert by_name["att"] == (3 * (16 * 4 * 4 + 4 * 4) + 4 * 4 * 16) * 4  # q,k,v + output kernel
    assert by_name["up"] == 16 * 32 * 4 and by_name["out"] == 16 * 64 * 4
    att, out, emb = names.index("att"), names.index("out"), names.index("emb")
    # Megatron's f and g around the attention and the feed-forward, forward and backward; the
    # vocabulary-split embedding's sum; the split logits' input gradient and the loss's 3 sums.
    assert reductions == ((emb, 8 * 16 * 4),) + ((att, 8 * 16 * 4),) * 4 + (
        (out, 8 * 16 * 4),) + ((out, 8 * 4),) * 3 and heads == 4


@pytest.mark.slow  # seconds of training, a TF process or waiting: make test, not test-fast
def test_profile_times_attention_with_the_arguments_of_its_call():
    from tfdist.advise.profile import profile_model
    from tfdist.core import flavour

    keras = flavour.get_keras()
    x = keras.Input((32, 64))  # large enough that its forward stands out of the call overhead
    att = keras.layers.MultiHeadAttention(2, 32, name="att")(x, x, use_causal_mask=True)
    prof = profile_model(keras.Model(x, keras.layers.Dense(3, name="out")(att)), 16, repeats=1)
    assert prof.names == ("att", "out") and prof.heads == 2
    assert prof.reductions == ((0, 32 * 64 * 4),) * 4  # as layer(h, h), not layer(h)
    assert prof.forward[0].at(16) > 0


@pytest.fixture
def tensor_strategy():
    register("mesh_test_tensor", "tfdist.strategies.multi_worker:MultiWorkerMirroredStrategy",
             traits=StrategyTraits(roles=("chief", "worker"),
                                   launch_options={"tensor": "TFDIST_TEST_SHARDS"}))
    yield
    unregister("mesh_test_tensor")


def test_advise_ranks_tensor_layouts_once_a_strategy_takes_tensor(tensor_strategy):
    net = network.Constants(LINK, {"tf": LINK}, 0.0, 2, {}, {})
    advice = advise(None, Cluster(2, cores=2), batch=32, constants=net, profile=PROFILE,
                    backends=("tf",))
    split = [p for p in advice.predictions if p.candidate.tensor == 2]
    assert split and split[0].candidate.processes == 2
    direct = predict(split[0].candidate, PROFILE, {"tf": LINK}, Cluster(2, cores=2), 32)
    assert split[0].step_s == pytest.approx(direct.step_s)
