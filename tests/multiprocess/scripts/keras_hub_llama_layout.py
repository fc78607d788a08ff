"""KerasHub's Llama under Keras's ModelParallel with its own recipe (no tfdist import).

As KerasHub documents ``LlamaBackbone.get_layout_map``: a ``DeviceMesh`` with ``batch`` and
``model`` axes over ``keras.distribution.list_devices()``, the backbone's layout map, a
``ModelParallel`` with ``batch_dim_name="batch"``, the causal LM created from a config (no
download) under ``distribution.scope()``, compiled (Adam) and fitted on token batches with a
padding mask and sample weights, then saved.

After that (the test's part): the same steps in this process without a distribution, from the
same initial weights: the reference. Each process writes what it saw to ``TFDIST_RESULT_DIR``.
"""

import json
import os
import sys

import keras
import keras_hub
import numpy as np
import tensorflow as tf

VOCAB, SEQ, GLOBAL_BATCH, STEPS = 64, 8, 4, 3


def create_model():
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=VOCAB, num_layers=1, num_query_heads=4, num_key_value_heads=2,
        hidden_dim=32, intermediate_dim=64)
    return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)


def compile_model(model):
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  weighted_metrics=None)


keras.distribution.initialize()
devices = keras.distribution.list_devices()
shape = tuple(int(s) for s in (sys.argv[sys.argv.index("--mesh") + 1].split(",")
                               if "--mesh" in sys.argv else (1, len(devices))))
mesh = keras.distribution.DeviceMesh(shape=shape, axis_names=("batch", "model"), devices=devices)
layout_map = keras_hub.models.LlamaBackbone.get_layout_map(mesh)
distribution = keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
rng = np.random.default_rng(0)
tokens = rng.integers(1, VOCAB, size=(GLOBAL_BATCH * STEPS, SEQ + 1)).astype("int32")
mask = np.ones((GLOBAL_BATCH * STEPS, SEQ), "int32")
mask[::3, -2:] = 0
features = {"token_ids": tokens[:, :-1], "padding_mask": mask}
weights = (mask * rng.uniform(0.5, 1.5, size=mask.shape)).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((features, tokens[:, 1:], weights)).batch(
    GLOBAL_BATCH)

keras.utils.set_random_seed(1)
with distribution.scope():
    model = create_model()
initial = model.get_weights()
compile_model(model)
history = model.fit(dataset, epochs=1, verbose=0)
held_bytes = int(sum(v.numpy().nbytes for v in model.weights))
out_dir = os.environ.get("TFDIST_RESULT_DIR", ".")
path = os.path.join(out_dir, "llama.keras")
saved = model.save(path) or (path if len(devices) == 1 else None)

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
    "loss": history.history["loss"], "reference_loss": reference_history.history["loss"],
    "held_bytes": held_bytes, "implied_bytes": int(implied),
    "whole_bytes": int(sum(w.nbytes for w in initial)), "saved": saved,
    "reverse_embeddings_bytes": int(sum(w.nbytes for v, w in zip(reference.weights, initial,
                                                                  strict=True)
                                        if v.path.endswith("reverse_embeddings"))),
    "kinds": sorted({layer.kind for layer in getattr(model, "tensor_plan", None).layers})
    if hasattr(model, "tensor_plan") else [],
    "moved": float(max(np.max(np.abs(a - b)) for a, b in zip(
        reference.get_weights(), initial, strict=True))),
}
if saved:
    whole = keras.models.load_model(saved)
    result["gaps"] = {v.path: float(np.max(np.abs(v.numpy() - w))) for v, w in zip(
        whole.weights, reference.get_weights(), strict=True)}
if "--then-sabotage" in sys.argv:
    # The test's sabotage: the hidden-unit split of q/k/v without its all-reduces across the
    # processes (the one-process block check still runs them whole), trained again.
    from tfdist.parallel import mappings
    from tfdist.tensor import inplace

    hidden = inplace._WRAPS["hidden"]

    def skipping(layer, group, timeout):
        hidden(layer, group, timeout)
        if not hasattr(group, "reduce_locally"):
            call = layer.call

            def alone(inputs, training=None):
                saved = mappings.copy_to_group
                mappings.copy_to_group = lambda x, *_: x
                try:
                    return call(inputs, training)
                finally:
                    mappings.copy_to_group = saved

            layer.call = alone

    inplace._WRAPS["hidden"] = skipping
    keras.distribution.set_distribution(distribution)
    model = create_model()
    model.set_weights(initial)
    compile_model(model)
    model.fit(dataset, epochs=1, verbose=0)
    saved = model.save(path)
    if saved:
        whole = keras.models.load_model(saved)
        result["sabotage_gap"] = float(max(np.max(np.abs(a - b)) for a, b in zip(
            whole.get_weights(), reference.get_weights(), strict=True)))
task = json.loads(os.environ.get("TF_CONFIG", '{"task": {"type": "worker", "index": 0}}'))["task"]
with open(os.path.join(out_dir, f"{task['type']}_{task['index']}.json"), "w") as file:
    json.dump(result, file)
