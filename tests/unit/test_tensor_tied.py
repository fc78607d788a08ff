"""Tied input/output embeddings under the tensor strategy, in one process: a
``ReversibleEmbedding`` (KerasHub's call convention) is split once by vocabulary rows (kind
``tied``), one the split cannot do is replicated with the reason or refused (field, value,
fix), a weight shared by two layers is refused, the split layer's math with a group of one
equals the whole layer's, and tf-keras is refused by the strategy itself. T=2 parity is
tests/multiprocess/test_tensor.py."""

from __future__ import annotations

from functools import partial

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.errors import KerasCompatibilityError, StrategyConfigError
from tfdist.parallel.mesh import TENSOR, Mesh
from tfdist.tensor.build import vocab_start
from tfdist.tensor.layers import TiedVocabEmbedding
from tfdist.tensor.rules import plan_model
from tfdist.tensor.stages import plan_stages

pytestmark = pytest.mark.unit


@keras.saving.register_keras_serializable("tfdist_unit_tests")
class ReversibleEmbedding(keras.layers.Embedding):
    """KerasHub's tied embedding, in small (``tie_weights``, ``logit_soft_cap``)."""

    def __init__(self, input_dim, output_dim, tie_weights=True, logit_soft_cap=None, **kwargs):
        super().__init__(input_dim, output_dim, **kwargs)
        self.tie_weights, self.logit_soft_cap = tie_weights, logit_soft_cap

    def call(self, inputs, reverse=False):
        if not reverse:
            return super().call(inputs)
        logits = keras.ops.matmul(inputs, keras.ops.transpose(self.embeddings))
        cap = self.logit_soft_cap
        return logits if cap is None else keras.ops.tanh(logits / cap) * cap

    def compute_output_spec(self, inputs, reverse=False):
        if reverse:
            return keras.KerasTensor((*inputs.shape[:-1], self.input_dim),
                                     dtype=self.compute_dtype)
        return super().compute_output_spec(inputs)

    def get_config(self):
        return {**super().get_config(), "tie_weights": self.tie_weights,
                "logit_soft_cap": self.logit_soft_cap}


def tied_lm(vocab=16, reverse_output=True, **options):
    tokens = keras.Input((6,), dtype="int32")
    embedding = ReversibleEmbedding(vocab, 8, name="emb", **options)
    x = keras.layers.LayerNormalization(name="ln")(embedding(tokens))
    h = keras.layers.Dense(16, activation="relu", name="up")(x)
    x = keras.layers.Add(name="add")([x, keras.layers.Dense(8, name="down")(h)])
    logits = embedding(x, reverse=True)
    if not reverse_output:
        logits = keras.layers.Activation("linear", name="after")(logits)
    return keras.Model(tokens, logits)


class Head(keras.layers.Layer):
    """Logits from another layer's matrix: the tie a config cannot carry."""

    def __init__(self, embedding, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embedding

    def call(self, x):
        return keras.ops.matmul(x, keras.ops.transpose(self.embedding.embeddings))

    def get_config(self):
        return keras.layers.Layer.get_config(self)


def shared_lm():
    tokens = keras.Input((6,), dtype="int32")
    embedding = keras.layers.Embedding(16, 8, name="emb")
    x = keras.layers.Dense(8, name="mid")(embedding(tokens))
    return keras.Model(tokens, Head(embedding, name="head")(x))


def test_a_tied_embedding_is_split_once_by_vocabulary_rows_and_gives_the_logits():
    plan = plan_model(tied_lm(), 2)
    emb = plan.layer("emb")
    assert (emb.kind, emb.class_name) == ("tied", "ReversibleEmbedding")
    assert [(w.shape, w.axis) for w in emb.weights] == [((16, 8), 0)]
    assert plan.output_layer == "emb" and plan.vocabulary == 16
    assert (plan.layer("up").kind, plan.layer("down").kind) == ("column", "row")
    assert plan.bytes_per_process < plan.whole_bytes
    second = Mesh.for_processes(2, tensor=2).group(TENSOR, 1)
    assert vocab_start(plan, second) == 8
    # in a pipeline too: split by vocabulary rows, the last stage gathering its logits whole
    staged = plan_stages(tied_lm(), 2).layer("emb")
    assert staged.kind == "tied" and "gathered whole" in staged.reason


# Models made by the test that reads them, not while collecting (in each pytest-xdist worker);
# partial, not lambda, keeps the test ids (model0, model1, ...).
@pytest.mark.parametrize("model, reason", [
    (partial(tied_lm, tie_weights=False), "tie_weights=False"),
    (partial(tied_lm, reverse_output=False), "not the model's only output"),
    (partial(tied_lm, embeddings_regularizer="l2"), "regularizer"),
])
def test_a_tied_embedding_the_split_cannot_do_is_replicated_with_the_reason(model, reason):
    layer = plan_model(model(), 2).layer("emb")
    assert layer.kind == "replicated" and reason in layer.reason


@pytest.mark.parametrize("model, rules, shards, words", [
    (partial(tied_lm), {"emb": "vocab"}, 2, ["ties its embedding", "Received: emb: vocab",
                                             "Fix: rules={'emb': 'tied'}"]),
    (partial(tied_lm, tie_weights=False), {"emb": "tied"}, 2, [
        "tie_weights=False", "Received: emb: tied", "Fix: replicate it"]),
    (partial(tied_lm, vocab=15), None, 2, ["input_dim (vocabulary) 15", "T=2", "'replicated'"]),
    (partial(shared_lm), None, 2, [
        "share the weight 'emb/embeddings'", "Received: emb/embeddings in emb",
        "Fix: tie the embedding with keras_hub.layers.ReversibleEmbedding"]),
    (partial(shared_lm), None, 1, ["share the weight"]),
])
def test_a_tie_that_would_be_mis_split_is_refused_with_the_field_the_value_and_the_fix(
        model, rules, shards, words):
    with pytest.raises(StrategyConfigError) as error:
        plan_model(model(), shards, rules)
    for word in words:
        assert word in str(error.value)


@pytest.mark.parametrize("cap", [None, 2.0])
def test_the_split_layer_with_a_group_of_one_is_the_whole_layer(cap):
    whole = ReversibleEmbedding(16, 8, logit_soft_cap=cap)
    split = TiedVocabEmbedding(16, 8, start=0, group=Mesh().group(TENSOR, 0),
                               logit_soft_cap=cap)
    ids, hidden = np.arange(12).reshape(2, 6) % 16, np.random.default_rng(0).normal(
        size=(2, 6, 8)).astype("float32")
    whole.build((None,)), split.build((None,))
    split.embeddings.assign(whole.embeddings)
    gradients = []
    for layer in (whole, split):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(ids) ** 2) + tf.reduce_sum(layer(hidden, reverse=True))
        gradients.append(tf.convert_to_tensor(tape.gradient(loss, layer.embeddings)))
        np.testing.assert_allclose(layer(hidden, reverse=True), whole(hidden, reverse=True),
                                   atol=1e-6)
    np.testing.assert_allclose(gradients[1], gradients[0], atol=1e-5)


@pytest.mark.slow  # two fits (2 CPU-s): make test, not test-fast
def test_one_shard_of_a_tied_model_trains_and_predicts_like_keras():
    from tfdist.strategies.tensor import TensorStrategy

    strategy = TensorStrategy()
    keras.utils.set_random_seed(3)
    whole = tied_lm()
    model = strategy.build_model(whole)
    assert strategy.plan.output_layer == "emb"
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(keras.optimizers.Adam(0.01), loss)
    whole.compile(keras.optimizers.Adam(0.01), loss, run_eagerly=True)  # the reference: no trace
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 16, (8, 6)), rng.integers(0, 16, (8, 6))
    got = model.fit(x, y, batch_size=4, shuffle=False, verbose=0).history["loss"]
    want = whole.fit(x, y, batch_size=4, shuffle=False, verbose=0).history["loss"]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(model.predict(x, verbose=0), whole.predict(x, verbose=0),
                               atol=1e-5)


def test_the_strategy_itself_refuses_tf_keras_with_the_field_the_value_and_the_fix(
        monkeypatch):
    from tfdist.strategies.tensor import TensorStrategy

    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    with pytest.raises(KerasCompatibilityError) as error:
        TensorStrategy()
    message = str(error.value)
    for words in ("cannot train with tf-keras", "Received: strategy='tensor' with tf-keras",
                  "Expected: Keras 3", "Fix: unset TF_USE_LEGACY_KERAS"):
        assert words in message
