"""Small functional models with what a layer chain lacks, for the pipeline's graph tests: skips
across the cut (a residual MLP whose blocks can be nested functional models), two inputs, and a
Transformer with a padding-mask input and an output projection tied to its input embedding.

Each model comes with data and its compile arguments (`MODELS`); `layer_weights` reads a built
model's weights layer by layer in the order the pipeline's spec lists them, so a pipeline's
gathered weights and a one-process reference compare index by index.
"""

from __future__ import annotations

import contextlib

import numpy as np

from tfdist.core import flavour
from tfdist.pipeline import graph

keras = flavour.get_keras()
GLOBAL = 16
VOCAB, SEQ, WIDTH = 11, 6, 8


def residual(nested=False):
    """x -> d0 -> 3 residual blocks (dense, dense, add the block's input) -> out. Every cut
    inside a block carries the block's input as a skip; ``nested``: each block is a functional
    keras.Model (flattened by the pipeline)."""
    x = keras.Input((5,), name="x")
    h = keras.layers.Dense(WIDTH, activation="tanh", name="d0")(x)
    for i in range(3):
        def block(inp, i=i):
            a = keras.layers.Dense(WIDTH, activation="tanh", name=f"b{i}_a")(inp)
            b = keras.layers.Dense(WIDTH, name=f"b{i}_b")(a)
            return keras.layers.Add(name=f"b{i}_add")([inp, b])
        if nested:
            inner = keras.Input((WIDTH,), name=f"b{i}_in")
            h = keras.Model(inner, block(inner), name=f"block{i}")(h)
        else:
            h = block(h)
    # The model input again at the end: a skip from the data across every cut.
    joined = keras.layers.Concatenate(name="join")([h, x])
    return keras.Model(x, keras.layers.Dense(1, name="out")(joined), name="residual")


def with_ops():
    """Dense layers joined by ``keras.ops`` calls, as KerasHub's graphs are (Gemma scales its
    embedding with ``ops.multiply``, BERT pools with ``x[:, 0]``): each call is an operation
    node, not a layer, in the functional graph."""
    x = keras.Input((5,), name="x")
    h = keras.layers.Dense(WIDTH, activation="tanh", name="d0")(x)
    h = keras.ops.multiply(h, 1.5)
    h = keras.layers.Dense(2 * WIDTH, activation="tanh", name="d1")(h)
    h = keras.layers.Reshape((2, WIDTH), name="pairs")(h)
    first = h[:, 0]
    h = keras.ops.add(keras.layers.Dense(WIDTH, name="d2")(first), h[:, 1])
    return keras.Model(x, keras.layers.Dense(1, name="out")(h), name="with_ops")


def two_inputs():
    """Float features and an integer category (an Embedding), joined; a skip over the cut."""
    features = keras.Input((4,), name="features")
    category = keras.Input((1,), dtype="int32", name="category")
    f = keras.layers.Dense(WIDTH, activation="tanh", name="f0")(features)
    e = keras.layers.Flatten(name="flat")(keras.layers.Embedding(7, WIDTH, name="emb")(category))
    h = keras.layers.Concatenate(name="cat")([f, e])
    g = keras.layers.Dense(WIDTH, activation="tanh", name="g0")(h)
    g = keras.layers.Dense(WIDTH, activation="tanh", name="g1")(g)
    joined = keras.layers.Add(name="add")([g, f])
    return keras.Model([features, category], keras.layers.Dense(1, name="out")(joined),
                       name="two_inputs")


@keras.saving.register_keras_serializable("tfdist_tests")
class TiedEmbedding(keras.layers.Embedding):
    """An embedding that, called with ``reverse=True``, projects back onto the vocabulary with
    its own matrix transposed (KerasHub's ReversibleEmbedding, in small)."""

    def call(self, inputs, reverse=False):
        if reverse:
            return keras.ops.matmul(inputs, keras.ops.transpose(self.embeddings))
        return super().call(inputs)

    def compute_output_spec(self, inputs, reverse=False):
        if reverse:
            return keras.KerasTensor((*inputs.shape[:-1], self.input_dim), self.compute_dtype)
        return super().compute_output_spec(inputs)


@keras.saving.register_keras_serializable("tfdist_tests")
class MaskedSelfAttention(keras.layers.Layer):
    """Self-attention over the positions the padding mask keeps."""

    def __init__(self, heads=2, key_dim=4, **kwargs):
        super().__init__(**kwargs)
        self.heads, self.key_dim = heads, key_dim
        self.attention = keras.layers.MultiHeadAttention(heads, key_dim, name="mha")

    def build(self, x_shape, padding_mask_shape=None):
        self.attention.build(x_shape, x_shape)

    def call(self, x, padding_mask):
        keep = keras.ops.cast(padding_mask, "bool")
        mask = keras.ops.logical_and(keep[:, None, :], keep[:, :, None])
        return self.attention(x, x, attention_mask=mask)

    def compute_output_shape(self, x_shape, padding_mask_shape=None):
        return x_shape

    def get_config(self):
        return {**super().get_config(), "heads": self.heads, "key_dim": self.key_dim}


def transformer():
    """token ids + padding mask -> tied embedding -> 2 blocks (masked attention + MLP, each
    with a residual and LayerNormalization) -> the embedding reversed: logits per token."""
    tokens = keras.Input((SEQ,), dtype="int32", name="token_ids")
    padding = keras.Input((SEQ,), dtype="int32", name="padding_mask")
    embedding = TiedEmbedding(VOCAB, WIDTH, name="embedding")
    h = embedding(tokens)
    for i in range(2):
        a = MaskedSelfAttention(name=f"attn{i}")(h, padding_mask=padding)
        h = keras.layers.LayerNormalization(name=f"ln{i}_a")(keras.layers.Add(name=f"res{i}_a")(
            [h, a]))
        m = keras.layers.Dense(2 * WIDTH, activation="relu", name=f"mlp{i}_in")(h)
        m = keras.layers.Dense(WIDTH, name=f"mlp{i}_out")(m)
        h = keras.layers.LayerNormalization(name=f"ln{i}_b")(keras.layers.Add(name=f"res{i}_b")(
            [h, m]))
    logits = embedding(h, reverse=True)
    return keras.Model([tokens, padding], logits, name="transformer")


def mobilenet():
    """keras.applications' MobileNetV2, small (32x32 images, width 0.35, 4 classes); trained in
    float64 (`FLOAT64`)."""
    return keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None,
                                          classes=4)


FLOAT64 = frozenset({"mobilenet"})
"""Models built, compiled and trained in float64 (`floatx_of`). MobileNetV2's training at
initialization amplifies rounding beyond the update itself: in float32, one process trained
twice, with oneDNN's kernels and without (``TF_ENABLE_ONEDNN_OPTS=0``), ends 3 steps 0.17
apart, more than its largest update (0.13), and the pipeline matched one process within 1.3e-6
on one CPU and 1.3e-3 on another (AMD EPYC); with the model alone in float64 and its loss in
float32, 5e-6. In float64 throughout: 1e-15, so the comparison tests the split, not a CPU's
kernels."""


@contextlib.contextmanager
def floatx_of(name):
    """Keras's default float type for model ``name`` (float64 for `FLOAT64`) while in the
    block: its layers, loss and optimizer take it when they are made."""
    before = keras.backend.floatx()
    keras.backend.set_floatx("float64" if name in FLOAT64 else before)
    try:
        yield
    finally:
        keras.backend.set_floatx(before)


def image_data(steps):
    rng = np.random.default_rng(10)
    x = rng.normal(size=(steps * GLOBAL, 32, 32, 3))  # float64: the model's (`FLOAT64`)
    return x, rng.integers(0, 4, size=steps * GLOBAL).astype("int32")


def residual_data(steps):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(steps * GLOBAL, 5)).astype("float32")
    return x, (np.sin(x[:, :1] * 2) + x[:, 1:2] * x[:, 2:3]).astype("float32")


def two_input_data(steps):
    rng = np.random.default_rng(8)
    features = rng.normal(size=(steps * GLOBAL, 4)).astype("float32")
    category = rng.integers(0, 7, size=(steps * GLOBAL, 1)).astype("int32")
    y = (np.cos(features[:, :1]) + category / 7.0).astype("float32")
    return [features, category], y


def transformer_data(steps):
    rng = np.random.default_rng(9)
    rows = steps * GLOBAL
    tokens = rng.integers(1, VOCAB, size=(rows, SEQ)).astype("int32")
    lengths = rng.integers(2, SEQ + 1, size=rows)
    padding = (np.arange(SEQ)[None, :] < lengths[:, None]).astype("int32")
    tokens = tokens * padding
    targets = np.roll(tokens, -1, axis=1)
    return [tokens, padding], targets


MODELS = {
    "residual": (residual, residual_data, "mse", "sgd"),
    "residual_adam": (residual, residual_data, "mse", "adam"),
    "nested": (lambda: residual(nested=True), residual_data, "mse", "sgd"),
    "two_inputs": (two_inputs, two_input_data, "mse", "sgd"),
    "ops": (with_ops, residual_data, "mse", "adam"),
    "transformer": (transformer, transformer_data, "sparse_ce_logits", "adam"),
    # float64 and a small step: with BatchNormalization in every block, rounding differences
    # grow fast (`FLOAT64`)
    "mobilenet": (mobilenet, image_data, "sparse_ce", "sgd_small"),
}


def compile_args(loss, optimizer):
    losses = {"mse": "mse", "sparse_ce": "sparse_categorical_crossentropy",
              "sparse_ce_logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}
    optimizers = {"sgd": lambda: keras.optimizers.SGD(0.05, momentum=0.5),
                  "sgd_small": lambda: keras.optimizers.SGD(0.002),
                  "adam": lambda: keras.optimizers.Adam(0.01)}
    return {"optimizer": optimizers[optimizer](), "loss": losses[loss]}


def layer_weights(model):
    """Every layer's weights, layers in the order the pipeline's spec lists them."""
    return [w for layer in graph.read_graph(model).layers
            for w in getattr(layer, "get_weights", list)()]  # an operation holds none
