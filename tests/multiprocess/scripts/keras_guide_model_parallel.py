"""Keras's distribution guide, model parallel, on a small Transformer (no tfdist import).

Written from the guide's description ("Distributed training with Keras 3"): list the devices,
lay them out as a 2-D ``DeviceMesh`` with a ``batch`` and a ``model`` axis, write a
``LayoutMap`` by hand that shards the embedding by vocabulary rows, the attention's query, key
and value kernels by heads, its output projection by heads, the feed-forward's first kernel by
columns and its second by rows, make a ``ModelParallel`` with ``batch_dim_name="batch"``,
create the model under ``distribution.scope()``, then plain ``compile`` (Adam with global norm
clipping), ``fit`` on a batched ``tf.data`` dataset with sample weights, ``evaluate``,
``predict`` and ``save``.

After that (the test's part): the same steps without any distribution in this process, from the
same initial weights, on the same global batches: the reference. Each process writes what it
saw to ``TFDIST_RESULT_DIR`` (``--mesh D,T`` picks the mesh; default ``1,N``).
"""

import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

VOCAB, SEQ, WIDTH, HEADS, GLOBAL_BATCH, STEPS = 32, 6, 16, 4, 8, 3


@keras.saving.register_keras_serializable(package="guide")
class Block(keras.layers.Layer):
    """Pre-norm attention and feed-forward, each with its residual."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.attention = keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS, name="attention")
        self.norm1 = keras.layers.LayerNormalization(name="norm1")
        self.norm2 = keras.layers.LayerNormalization(name="norm2")
        self.ffn_up = keras.layers.Dense(4 * WIDTH, activation="gelu", name="ffn_up")
        self.ffn_down = keras.layers.Dense(WIDTH, name="ffn_down")

    def call(self, x):
        h = self.norm1(x)
        x = x + self.attention(h, h, use_causal_mask=True)
        return x + self.ffn_down(self.ffn_up(self.norm2(x)))


def create_model():
    tokens = keras.Input((SEQ,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, WIDTH, name="token_emb")(tokens)
    x = Block(name="block")(x)
    x = keras.layers.LayerNormalization(name="final_norm")(x)
    return keras.Model(tokens, keras.layers.Dense(VOCAB, name="logits")(x))


def data():
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCAB, size=(GLOBAL_BATCH * STEPS, SEQ)).astype("int32")
    y = np.roll(x, -1, axis=1)
    weights = rng.uniform(0.5, 1.5, size=(GLOBAL_BATCH * STEPS, SEQ)).astype("float32")
    return x, y, weights


def compile_model(model):
    model.compile(optimizer=keras.optimizers.Adam(0.01, global_clipnorm=1.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


keras.distribution.initialize()
devices = keras.distribution.list_devices()
shape = tuple(int(s) for s in (sys.argv[sys.argv.index("--mesh") + 1].split(",")
                               if "--mesh" in sys.argv else (1, len(devices))))
mesh = keras.distribution.DeviceMesh(shape=shape, axis_names=["batch", "model"], devices=devices)
layout_map = keras.distribution.LayoutMap(mesh)
layout_map["token_emb/embeddings"] = ("model", None)
layout_map["block/attention/(query|key|value)/kernel"] = (None, "model", None)
layout_map["block/attention/(query|key|value)/bias"] = ("model", None)
layout_map["block/attention/attention_output/kernel"] = ("model", None, None)
layout_map["block/ffn_up/kernel"] = (None, "model")
layout_map["block/ffn_up/bias"] = ("model",)
layout_map["block/ffn_down/kernel"] = ("model", None)
layout_map["logits/output"] = ("batch", None, None)
distribution = keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")

keras.utils.set_random_seed(1)
with distribution.scope():
    model = create_model()
initial = model.get_weights()
compile_model(model)
x, y, sample_weight = data()
dataset = tf.data.Dataset.from_tensor_slices((x, y, sample_weight)).batch(GLOBAL_BATCH)
history = model.fit(dataset, epochs=1, verbose=0)
evaluated = model.evaluate(dataset, verbose=0)
predicted = model.predict(x[:GLOBAL_BATCH], verbose=0)
held_bytes = int(sum(v.numpy().nbytes for v in model.weights))
out_dir = os.environ.get("TFDIST_RESULT_DIR", ".")
path = os.path.join(out_dir, "model_parallel.keras")
saved = model.save(path) or (path if len(devices) == 1 else None)

# ---- The test's part: one process, no distribution, the same initial weights and batches.
keras.distribution.set_distribution(None)
reference = create_model()
reference.set_weights(initial)
compile_model(reference)
reference_history = reference.fit(dataset, epochs=1, verbose=0)
implied = 0
for variable, value in zip(reference.weights, initial, strict=True):
    layout = layout_map[variable.path]
    implied += value.nbytes // (shape[1] if layout is not None and "model" in layout.axes else 1)
result = {
    "devices": devices, "loss": history.history["loss"], "evaluated": evaluated,
    "reference_loss": reference_history.history["loss"],
    "reference_evaluated": reference.evaluate(dataset, verbose=0),
    "predicted_gap": float(np.max(np.abs(predicted - reference.predict(x[:GLOBAL_BATCH],
                                                                        verbose=0)))),
    "held_bytes": held_bytes, "implied_bytes": int(implied),
    "whole_bytes": int(sum(w.nbytes for w in initial)),
    "class": type(model).__name__, "saved": saved,
    "moved": float(max(np.max(np.abs(a - b)) for a, b in zip(
        reference.get_weights(), initial, strict=True))),
}
if saved:
    whole = keras.models.load_model(saved)
    result["gaps"] = {v.path: float(np.max(np.abs(v.numpy() - w))) for v, w in zip(
        whole.weights, reference.get_weights(), strict=True)}
task = json.loads(os.environ.get("TF_CONFIG", '{"task": {"type": "worker", "index": 0}}'))["task"]
with open(os.path.join(out_dir, f"{task['type']}_{task['index']}.json"), "w") as file:
    json.dump(result, file)
