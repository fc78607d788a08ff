"""Tensor parallelism in one process: the rules and the plan they make, the refusals (field,
value, fix), the docstring examples, and the strategy at T=1 (the split layers' math with a
group of one)."""

from __future__ import annotations

import doctest
import importlib
from functools import partial

import keras
import numpy as np
import pytest

from tfdist.errors import StrategyConfigError
from tfdist.tensor.rules import plan_model

pytestmark = pytest.mark.unit

MODULES = ["tfdist.tensor.plan", "tfdist.tensor.rules", "tfdist.parallel.mappings",
           "tfdist.tensor.layers", "tfdist.tensor.initializers", "tfdist.tensor.loss",
           "tfdist.tensor.build", "tfdist.tensor.tied", "tfdist.strategies.tensor"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, monkeypatch):
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def tiny_lm(heads=4, vocab=16, hidden=32, regularize=False):
    layers = keras.layers
    tokens = keras.Input((6,), dtype="int32")
    x = layers.Embedding(vocab, 8, name="emb")(tokens)
    h = layers.LayerNormalization(name="ln")(x)
    x = layers.Add(name="add")([x, layers.MultiHeadAttention(heads, 2, name="attn")(h, h)])
    extra = {"kernel_regularizer": "l2"} if regularize else {}
    h = layers.Dense(hidden, activation="relu", name="up", **extra)(x)
    x = layers.Add(name="add2")([x, layers.Dense(8, name="down")(h)])
    return keras.Model(tokens, layers.Dense(vocab, name="head")(x))


def kinds(plan):
    return {layer.name: layer.kind for layer in plan.layers}


def test_standard_layers_are_split_automatically_and_the_rest_replicated():
    plan = plan_model(tiny_lm(), 2)
    assert kinds(plan) == {"emb": "vocab", "ln": "replicated", "attn": "heads", "add": "replicated",
                           "up": "column", "down": "row", "add2": "replicated", "head": "output"}
    replicated = sum(w.whole_bytes for layer in plan.layers for w in layer.weights
                     if w.axis is None)
    assert plan.bytes_per_process == plan.split_bytes // 2 + replicated
    attn = {w.name.split("/", 1)[1]: w.axis for w in plan.layer("attn").weights}
    assert attn == {"query/kernel": 1, "query/bias": 0, "key/kernel": 1, "key/bias": 0,
                    "value/kernel": 1, "value/bias": 0, "attention_output/kernel": 0,
                    "attention_output/bias": None}
    assert [w.axis for w in plan.layer("down").weights] == [0, None]
    assert plan.as_dict()["layers"][0]["kind"] == "vocab"
    assert "attn" in plan.table() and "heads" in plan.table()


def test_a_layer_that_cannot_be_split_is_replicated_with_the_reason():
    plan = plan_model(tiny_lm(regularize=True), 2)
    assert kinds(plan)["up"] == kinds(plan)["down"] == "replicated"
    assert "regularizer" in plan.layer("up").reason


def test_user_rules_override_the_automatic_ones():
    plan = plan_model(tiny_lm(), 2, rules={"up|down": "replicated", "head": "replicated"})
    assert kinds(plan)["up"] == kinds(plan)["head"] == "replicated"
    assert plan.layer("head").reason == "rule 'head'"


# Models made by the test that reads them, not while collecting (in each pytest-xdist worker);
# partial, not lambda, keeps the test ids (model0, model1, ...).
@pytest.mark.parametrize("model, rules, shards, words", [
    (partial(tiny_lm), {"nothing.*": "replicated"}, 2, ["matches no layer", "nothing.*"]),
    (partial(tiny_lm), {"up": "diagonal"}, 2, ["unknown split", "'diagonal'"]),
    (partial(tiny_lm), {"ln": "heads"}, 2, ["cannot be split as 'heads'", "MultiHeadAttention"]),
    (partial(tiny_lm), {"down": "replicated"}, 2, ["not row-split", "'replicated'"]),
    (partial(tiny_lm, heads=3), None, 2, ["num_heads 3", "T=2", "'replicated'"]),
    (partial(tiny_lm, vocab=15), None, 2, ["input_dim (vocabulary) 15", "'replicated'"]),
    (partial(tiny_lm, hidden=30), None, 4, ["units 30", "T=4"]),
    (partial(tiny_lm, regularize=True), {"up": "column"}, 2, ["regularizer",
                                                              "replicate it"]),
])
def test_bad_splits_are_refused_with_the_field_the_value_and_the_fix(model, rules, shards,
                                                                     words):
    with pytest.raises(StrategyConfigError) as error:
        plan_model(model(), shards, rules)
    for word in words:
        assert word in str(error.value)
    assert "Fix:" in str(error.value) or "fix" in str(error.value).lower()


def test_more_shards_than_processes_or_a_mesh_that_does_not_divide_is_refused():
    from tfdist.strategies.tensor import TensorStrategy

    with pytest.raises(StrategyConfigError, match="tensor=2"):
        TensorStrategy(shards=2)
    three = {"cluster": {"worker": ["localhost:1", "localhost:2", "localhost:3"]},
             "task": {"type": "worker", "index": 0}}
    with pytest.raises(StrategyConfigError, match="a multiple of 2"):
        TensorStrategy(shards=2, tf_config=three)
    with pytest.raises(StrategyConfigError, match="positive int"):
        TensorStrategy(shards=0)


def test_a_loss_or_metrics_the_shards_cannot_compute_are_refused():
    from tfdist.strategies.tensor import TensorStrategy

    model = TensorStrategy().build_model(tiny_lm)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with pytest.raises(StrategyConfigError, match="only sparse softmax cross-entropy"):
        model.compile("adam", "mse")
    with pytest.raises(StrategyConfigError, match="Metrics cannot read logits"):
        model.compile("adam", loss, metrics=["accuracy"])


@pytest.mark.parametrize("optimizer, clip", [
    # make test-fast keeps Adam's global clipping; make test all three
    pytest.param("SGD", {"global_clipnorm": 0.05}, marks=pytest.mark.slow),
    pytest.param("SGD", {"clipnorm": 0.02}, marks=pytest.mark.slow),
    ("Adam", {"global_clipnorm": 0.05}),  # Adam tells row-slice from dense gradients apart
])
def test_norm_clipping_clips_as_keras_does(optimizer, clip):
    from tfdist.strategies.tensor import TensorStrategy

    keras.utils.set_random_seed(3)
    whole = tiny_lm()
    model = TensorStrategy().build_model(whole)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    make = getattr(keras.optimizers, optimizer)
    model.compile(make(0.5 if optimizer == "SGD" else 0.01, **clip), loss)
    # The reference runs eagerly: no trace (0.5 to 1 CPU-s), the same numbers within rounding
    whole.compile(make(0.5 if optimizer == "SGD" else 0.01, **clip), loss, run_eagerly=True)
    initial = [w.copy() for w in whole.get_weights()]
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 16, (16, 6)), rng.integers(0, 16, (16, 6))
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    whole.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    moved = max(np.abs(a - b).max() for a, b in zip(whole.get_weights(), initial, strict=True))
    assert moved > 1e-3
    if optimizer == "SGD":  # clipped: SGD(0.5) moves at most 0.5 x the clip norm per step
        assert moved < 2 * 0.5 * 0.06
    for got, want, variable in zip(model.get_weights(), whole.get_weights(), whole.weights,
                                   strict=True):
        if "key/bias" not in variable.path:  # an exact gradient of zero: float noise (docs)
            np.testing.assert_allclose(got, want, atol=1e-6, err_msg=variable.path)


def test_one_shard_trains_saves_and_predicts_like_keras(tmp_path):
    from tfdist.strategies.tensor import TensorStrategy

    strategy = TensorStrategy()
    keras.utils.set_random_seed(3)
    whole = tiny_lm()
    model = strategy.build_model(whole)
    assert strategy.plan.output_layer == "head"
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with strategy.scope():  # as scripts written for the other strategies compile
        model.compile(keras.optimizers.SGD(0.1), loss)
    whole.compile(keras.optimizers.SGD(0.1), loss, run_eagerly=True)  # the reference: no trace
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 16, (8, 6)), rng.integers(0, 16, (8, 6))
    got = model.fit(x, y, batch_size=4, verbose=0).history["loss"]
    want = whole.fit(x, y, batch_size=4, verbose=0).history["loss"]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    path = strategy.save_model(model, tmp_path / "m.keras")
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0),
                               atol=1e-6)
    assert strategy.weight_bytes(model) == strategy.plan.bytes_per_process


def test_the_registry_makes_it_by_name_and_refuses_tf_keras_with_the_fix():
    import tfdist
    from tfdist.core.registry import strategy_traits
    from tfdist.errors import KerasCompatibilityError

    strategy = tfdist.get_strategy("tensor", shards=1)
    assert strategy.describe() == "tensor: shard 0 of 1, replica 0 of 1, chief"
    traits = strategy_traits("tensor")
    # T travels in the mesh alone; --zero 1|2 shards on the data axis (tfdist.zero.data_axis)
    assert traits.launch_options == {"tensor": "TFDIST_MESH", "zero": "TFDIST_ZERO"}
    assert traits.tensor_default == "all"
    with pytest.raises(KerasCompatibilityError, match="unset TF_USE_LEGACY_KERAS"):
        traits.check_keras("tensor", "tf_keras")


@pytest.mark.parametrize("path", ["fit", pytest.param("custom loop", marks=pytest.mark.slow)])
def test_the_step_is_traced_once(path):
    # An optimizer whose slots are made in the step's first trace makes tf.function trace the
    # step twice (its first trace created variables): 2.5 of a shard's 6 CPU-s in a fit phase
    from tfdist.strategies.tensor import TensorStrategy

    strategy = TensorStrategy()
    model = strategy.build_model(tiny_lm)
    traces = []
    apply_step = model.apply_step
    model.apply_step = lambda *args: traces.append(1) or apply_step(*args)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 16, (8, 6)), rng.integers(0, 16, (8, 6))
    if path == "fit":
        model.compile(keras.optimizers.Adam(0.01), loss)
        model.fit(x, y, batch_size=4, verbose=0)
    else:
        step = strategy.train_step(model, loss, keras.optimizers.Adam(0.01))
        for i in (0, 4):
            step(x[i:i + 4], y[i:i + 4])
    assert len(traces) == 1


def test_a_plan_that_splits_nothing_is_refused_and_one_that_splits_little_is_said_loudly():
    from tfdist.tensor.plan import MIN_SPLIT_SHARE, check_coverage

    layers = keras.layers
    inputs = keras.Input((8,))
    unsplit = keras.Model(inputs, layers.Dense(4, name="only")(layers.LayerNormalization()(inputs)))
    with pytest.raises(StrategyConfigError) as refused:
        check_coverage(plan_model(unsplit, 2), "'unsplit'")
    message = str(refused.value)
    assert "T=2 splits none of 'unsplit'" in message and "only (Dense" in message
    assert "--strategy multi_worker" in message and "rules=" in message
    assert check_coverage(plan_model(unsplit, 1)) is None  # T=1 splits nothing by definition

    # A small split pair beside a large replicated Dense: 4.9% of the bytes split.
    x = layers.Dense(256, name="big")(inputs)
    x = layers.LayerNormalization(name="ln")(x)
    hidden = layers.Dense(8, name="up")(layers.Dense(4, name="squeeze")(x))
    little = keras.Model(inputs, layers.Dense(2, name="down")(hidden))
    plan = plan_model(little, 2)
    share = plan.split_bytes / plan.whole_bytes
    assert 0 < share < MIN_SPLIT_SHARE
    warning = check_coverage(plan, "'little'")
    assert f"splits only {share:.1%} of 'little'" in warning
    assert warning.index("big (Dense") < warning.index("ln (LayerNormalization")  # largest first
    assert check_coverage(plan_model(tiny_lm(), 2)) is None  # most of it split: nothing to say
