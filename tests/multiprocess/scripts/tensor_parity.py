"""One process of a tensor-parallel job (D replicas x T shards): trains a small Transformer LM
(token + position embedding, 2 blocks of causal attention + feed-forward with LayerNorm and
residuals, vocabulary projection) with Adam and ``model.fit``, and reports what the test checks.

Args: ``steps [--tied] [--sabotage] [--custom-loop] [--clip] [--save DIR] [--stall RANK
--deadline S] [--then-custom-loop] [--then-sabotage] [--no-reference]
[--unseeded]``. ``--tied`` ties the output
projection to the token embedding (one ``ReversibleEmbedding``, KerasHub's call convention:
``layer(ids)``, ``layer(hidden, reverse=True)``) instead of a separate ``lm_head``.
Every process first builds the model from its build function (each allocating only its shards: the
bytes are reported against the plan), then builds the whole model once with a fixed seed and takes
its shards from it, fits ``steps`` global batches of ``GLOBAL`` sequences, and reports the gathered
weights. The chief also trains the whole model in one process on the same global batches (the
reference). ``--clip`` clips the global gradient norm (below the first step's). ``--sabotage``
makes the row-split layers skip their all-reduce (the parity must then fail). ``--stall RANK`` gets
that process stuck (alive, heartbeats going) as its second training batch starts; the others, whose
steps have a deadline of ``--deadline`` seconds, must fail at it. Each process reports its OS
threads after training (a thread per collective op run was the leak of per-op timeouts).
``--then-custom-loop`` and ``--then-sabotage`` run more phases in the same job, each on a fresh
shard model from the same initial weights, reported under ``phases``: the custom-loop step, then
``fit`` with the row all-reduce skipped (one launch checked three ways; the reference is the
same). ``--no-reference``: the chief leaves the reference out (the test takes it from another
job that trained the same model on the same batches). The build function of the first build seeds
(``keras.utils.set_random_seed(INITIAL_SEED)`` inside it) and the chief reports ``initial_gap``:
the largest gap between the shards' weights, gathered right after ``build_model``, and the same
function's model built in one process; ``--unseeded`` then builds from an unseeded function
(`unseeded_gaps`)."""

from __future__ import annotations

import hashlib
import os
import sys

import keras
import numpy as np
from pause import stall

import tfdist
from tfdist.testing import exit_after_report, report

GLOBAL, VOCAB, SEQ, WIDTH, HEADS, HIDDEN, LR = 8, 16, 8, 16, 4, 32, 0.01
CLIP = 0.5
INITIAL_SEED = 5


@keras.saving.register_keras_serializable("tfdist_tests")
class PositionEmbedding(keras.layers.Layer):
    """Adds a learned vector per position."""

    def __init__(self, length, width, **kwargs):
        super().__init__(**kwargs)
        self.length, self.width = length, width

    def build(self, input_shape):
        self.positions = self.add_weight(name="positions", shape=(self.length, self.width),
                                         initializer="glorot_uniform")

    def call(self, inputs):
        return inputs + self.positions[None]

    def get_config(self):
        return {**super().get_config(), "length": self.length, "width": self.width}


@keras.saving.register_keras_serializable("tfdist_tests")
class ReversibleEmbedding(keras.layers.Embedding):
    """KerasHub's tied embedding, in small: ``layer(ids)`` looks up rows of ``embeddings``,
    ``layer(hidden, reverse=True)`` gives the logits ``hidden @ embeddings^T``."""

    def __init__(self, input_dim, output_dim, tie_weights=True, **kwargs):
        super().__init__(input_dim, output_dim, **kwargs)
        self.tie_weights = tie_weights

    def call(self, inputs, reverse=False):
        if reverse:
            return keras.ops.matmul(inputs, keras.ops.transpose(self.embeddings))
        return super().call(inputs)

    def compute_output_spec(self, inputs, reverse=False):
        if reverse:
            return keras.KerasTensor((*inputs.shape[:-1], self.input_dim),
                                     dtype=self.compute_dtype)
        return super().compute_output_spec(inputs)

    def get_config(self):
        return {**super().get_config(), "tie_weights": self.tie_weights}


@keras.saving.register_keras_serializable("tfdist_tests")
class RampInitializer(keras.initializers.Initializer):
    """Not a Keras initializer (its draws cannot be replayed): a ramp plus one offset per call
    from NumPy's global generator, unseeded and different in every process. The whole weight
    less the ramp is one constant exactly when all its slices come from one call."""

    def __call__(self, shape, dtype=None):
        ramp = np.arange(int(np.prod(shape)), dtype="float32").reshape(shape) / 1000.0
        return ramp + np.float32(np.random.uniform(1.0, 2.0))


def build(tied=False, ffn_initializer="glorot_uniform"):
    layers = keras.layers
    tokens = keras.Input((SEQ,), dtype="int32", name="tokens")
    embedding = (ReversibleEmbedding if tied else layers.Embedding)(VOCAB, WIDTH, name="tok_emb")
    x = embedding(tokens)
    x = PositionEmbedding(SEQ, WIDTH, name="pos_emb")(x)
    for b in range(2):
        h = layers.LayerNormalization(name=f"b{b}_ln1")(x)
        h = layers.MultiHeadAttention(HEADS, WIDTH // HEADS, name=f"b{b}_attn")(
            h, h, use_causal_mask=True)
        x = layers.Add(name=f"b{b}_add1")([x, h])
        h = layers.LayerNormalization(name=f"b{b}_ln2")(x)
        h = layers.Dense(HIDDEN, activation="gelu", name=f"b{b}_ffn_in",
                         kernel_initializer=ffn_initializer if b == 0 else "glorot_uniform")(h)
        h = layers.Dense(WIDTH, name=f"b{b}_ffn_out")(h)
        x = layers.Add(name=f"b{b}_add2")([x, h])
    x = layers.LayerNormalization(name="ln_f")(x)
    logits = embedding(x, reverse=True) if tied else layers.Dense(VOCAB, name="lm_head")(x)
    return keras.Model(tokens, logits, name="tiny_lm")


def seeded_build(tied=False):
    """`build` as a user's build function makes it: seeded inside."""
    keras.utils.set_random_seed(INITIAL_SEED)
    return build(tied)


def initial_gap(gathered, tied, names):
    """The largest gap between the weights ``gathered`` right after ``build_model`` (every
    layer's, by name) and one process's `seeded_build`."""
    one = seeded_build(tied)
    return max(float(np.max(np.abs(np.asarray(a) - b)))
               for a, b in zip(flat(gathered, names), flat(one, names), strict=True))


def unseeded_gaps(strategy, names):
    """``--unseeded``: builds from a build function that seeds nothing, with `RampInitializer`
    for ``b0_ffn_in``'s column-split kernel, and gathers the weights (a collective). On the
    chief: the largest gap of the other weights to one process building from the Python random
    state the chief started from (every process must hold the chief's draw), and the spread of
    that kernel less its ramp (0: one whole, drawn by one process). Every process: a digest of
    its shard's weights (the replicas' must be equal)."""
    import random

    random.seed(), np.random.seed()  # each process from its own entropy, as if never seeded
    start = random.getstate()
    model = strategy.build_model(lambda: build(ffn_initializer=RampInitializer()))
    held = {"unseeded_digest": digest(model.get_weights())}
    gathered = strategy.gather_weights(model)
    if not strategy.is_chief:
        return held
    random.setstate(start)
    one = build(ffn_initializer=RampInitializer())
    kernel = gathered["b0_ffn_in"][0]
    offset = kernel - np.arange(kernel.size, dtype="float32").reshape(kernel.shape) / 1000.0
    gathered["b0_ffn_in"], one_ffn = gathered["b0_ffn_in"][1:], one.get_layer("b0_ffn_in")
    ours = [w for name in names for w in gathered.get(name, [])]
    theirs = [w for name in names for w in (
        one_ffn.get_weights()[1:] if name == "b0_ffn_in" else one.get_layer(name).get_weights())]
    return {**held, "custom_spread": float(offset.max() - offset.min()),
            "unseeded_gap": max(float(np.max(np.abs(a - b)))
                                for a, b in zip(ours, theirs, strict=True))}


def data(steps):
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, VOCAB, size=(steps * GLOBAL, SEQ + 1)).astype("int32")
    return tokens[:, :-1], tokens[:, 1:]


def loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def optimizer(argv):
    """Adam; with ``--clip``, with a global-norm clip below the first step's norm."""
    return keras.optimizers.Adam(LR, global_clipnorm=CLIP if "--clip" in argv else None)


def first_gradient_norm(model, x, y):
    import tensorflow as tf

    with tf.GradientTape() as tape:
        value = loss()(y[:GLOBAL], model(x[:GLOBAL]))
    return float(tf.linalg.global_norm(tape.gradient(value, model.trainable_weights)))


def sabotage_row_reduce():
    """The row-split layers skip their all-reduce (each shard keeps its partial sum)."""
    from tfdist.tensor import layers as split

    def call(self, inputs, training=None):
        x = keras.ops.matmul(inputs, self.kernel)
        return x + self.bias if self.bias is not None else x

    split.RowDense.call = call


def digest(weights):
    return hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in weights)).hexdigest()


def flat(model_or_dict, names):
    if isinstance(model_or_dict, dict):
        return [w for name in names for w in model_or_dict.get(name, [])]
    return [w for name in names for w in model_or_dict.get_layer(name).get_weights()]


def stall_callbacks(argv, strategy):
    """``--stall RANK``: that process gets stuck as its second training batch starts: alive
    (TensorFlow's coordination service still gets its heartbeats) but never joining the step."""
    if "--stall" not in argv or strategy.rank != int(argv[argv.index("--stall") + 1]):
        return []
    stuck = keras.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: batch == 1 and
                                           stall(3600))
    return [stuck]


def train(strategy, model, x, y, argv, custom_loop, evaluate=True):
    """Trains ``model`` one epoch on the global batches; its logged loss (and under ``fit``,
    with ``evaluate``, evaluate and predict)."""
    if custom_loop:
        step = strategy.train_step(model, loss(), optimizer(argv))
        losses = [float(step(x[i:i + GLOBAL], y[i:i + GLOBAL])) for i in range(0, len(x), GLOBAL)]
        return {"loss": [float(np.mean(losses))]}
    model.compile(optimizer=optimizer(argv), loss=loss())
    history = model.fit(x, y, batch_size=GLOBAL, epochs=1, shuffle=False, verbose=0,
                        callbacks=stall_callbacks(argv, strategy))
    if not evaluate:
        return {"loss": history.history["loss"]}
    return {"loss": history.history["loss"],
            "evaluate": model.evaluate(x, y, batch_size=GLOBAL, verbose=0),
            "predict": model.predict(x[:GLOBAL], batch_size=GLOBAL, verbose=0).tolist()}


def later_phases(strategy, whole, argv, train_phase, gather):
    """``--then-custom-loop``, ``--then-sabotage``: each trains a fresh shard model made from
    ``whole`` (still holding the initial weights) with ``train_phase(model, custom_loop,
    evaluate)``; its result and, on the chief, its weights (``gather(model)``, a collective).
    The sabotaged phase is checked on its weights alone: no evaluate and predict (2 of its 3
    traced functions). Shared with `pipeline_tensor_parity`."""
    phases = {}
    for phase in ("custom-loop", "sabotage"):
        if f"--then-{phase}" not in argv:
            continue
        if phase == "sabotage":
            sabotage_row_reduce()
        model = strategy.build_model(whole)
        phases[phase] = train_phase(model, custom_loop=phase == "custom-loop",
                                    evaluate=phase != "sabotage")
        trained = gather(model)
        if strategy.is_chief:
            phases[phase]["trained"] = [np.asarray(w).tolist() for w in trained]
    return phases


def reference_results(tied, initial, names, x, y, argv):
    """The whole model trained in one process from ``initial`` on the same global batches
    (eagerly, as `tensor_hub_parity`'s reference)."""
    keras.utils.set_random_seed(1)
    reference = build(tied)
    reference.set_weights(initial)
    result = {"first_gradient_norm": first_gradient_norm(reference, x, y)}
    # eagerly: no traced train, test and predict functions (fit, evaluate and predict took
    # 3.3-4.4 CPU-s traced, 1.1-1.7 eager); its weights differ from the traced reference's by
    # at most 2e-8 beyond UPDATE_RTOL (the key biases' noise: 6.3e-5, NOISE_ATOL is 1e-3)
    reference.compile(optimizer=optimizer(argv), loss=loss(), run_eagerly=True)
    history = reference.fit(x, y, batch_size=GLOBAL, epochs=1, shuffle=False, verbose=0)
    return dict(
        result, reference=[w.tolist() for w in flat(reference, names)],
        reference_loss=history.history["loss"],
        reference_evaluate=reference.evaluate(x, y, batch_size=GLOBAL, verbose=0),
        reference_predict=reference.predict(x[:GLOBAL], batch_size=GLOBAL, verbose=0).tolist())


def main(argv):
    steps = int(argv[0])
    if "--sabotage" in argv:
        sabotage_row_reduce()
    options = {}
    if "--deadline" in argv:
        options["timeout_seconds"] = float(argv[argv.index("--deadline") + 1])
    strategy = tfdist.get_strategy("auto", **options)
    tied = "--tied" in argv
    # 1. From the build function: only the shards are allocated.
    from_fn = strategy.build_model(lambda: seeded_build(tied))
    plan = strategy.plan
    drawn = strategy.gather_weights(from_fn)  # a collective of the tensor group
    replicated = [v.numpy() for layer in plan.layers
                  for v, w in zip(from_fn.get_layer(layer.name).weights, layer.weights, strict=True)
                  if w.axis is None]
    result = {"strategy": strategy.name, "shards": strategy.shards,
              "replicas": strategy.num_replicas, "plan": plan.as_dict(),
              "fn_bytes": strategy.weight_bytes(from_fn),
              "replicated_digest": digest(replicated)}
    names = [layer.name for layer in plan.layers if layer.weights]
    if strategy.is_chief:
        result["initial_gap"] = initial_gap(drawn, tied, names)
    del from_fn, drawn
    # 2. From a whole model built with a fixed seed: the shards are its slices.
    keras.utils.set_random_seed(1)
    whole = build(tied)
    names = [layer.name for layer in whole.layers if layer.weights]
    initial = [w.copy() for w in whole.get_weights()]
    model = strategy.build_model(whole)
    x, y = data(steps)
    result.update(train(strategy, model, x, y, argv, custom_loop="--custom-loop" in argv))
    result["threads"] = len(os.listdir("/proc/self/task"))
    if "--unseeded" in argv:  # after counting the threads: each eager collective leaves one
        result.update(unseeded_gaps(strategy, names))  # asleep for its timeout
    result["held_bytes"] = strategy.weight_bytes(model)
    trained = flat(strategy.gather_weights(model), names)
    result["phases"] = later_phases(
        strategy, whole, argv,
        lambda shard, **how: train(strategy, shard, x, y, argv, **how),
        lambda shard: flat(strategy.gather_weights(shard), names))
    save_dir = argv[argv.index("--save") + 1] if "--save" in argv else None
    if save_dir:
        result["saved"] = strategy.save_model(model, os.path.join(save_dir, "model.keras"))
    if strategy.is_chief:
        result.update(trained=[w.tolist() for w in trained],
                      initial=[w.tolist() for w in initial])
        if "--no-reference" not in argv:
            result.update(reference_results(tied, initial, names, x, y, argv))
        if save_dir:
            loaded = keras.models.load_model(os.path.join(save_dir, "model.keras"))
            result["reloaded"] = [w.tolist() for w in flat(loaded, names)]
    report(result)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_after_report()
