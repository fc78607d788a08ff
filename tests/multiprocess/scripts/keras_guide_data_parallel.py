"""Keras's distribution guide, data parallel, on a small model (no tfdist import).

Written from the guide's description ("Distributed training with Keras 3"): initialize the
job, list its devices, make a ``DataParallel`` over them and set it globally, create and
compile the model, ``fit`` and ``evaluate`` on a batched ``tf.data`` dataset of the global batch
size, then a second ``fit`` on ``distribution.distribute_dataset(dataset)`` as the guide shows
it.

After that (the test's part): the same steps without any distribution in this process, from the
same initial weights, on the same global batches: the reference. Each process writes what it
saw to ``TFDIST_RESULT_DIR``.
"""

import json
import os

import keras
import numpy as np
import tensorflow as tf

GLOBAL_BATCH, STEPS = 8, 3


def create_model():
    inputs = keras.Input((6,))
    x = keras.layers.Dense(16, activation="relu")(inputs)
    x = keras.layers.Dropout(0.0)(x)
    return keras.Model(inputs, keras.layers.Dense(3)(x))


def compile_model(model):
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


keras.distribution.initialize()
devices = keras.distribution.list_devices()
data_parallel = keras.distribution.DataParallel(devices=devices)
keras.distribution.set_distribution(data_parallel)

rng = np.random.default_rng(0)
x = rng.normal(size=(GLOBAL_BATCH * STEPS, 6)).astype("float32")
y = rng.integers(0, 3, size=(GLOBAL_BATCH * STEPS,)).astype("int64")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
keras.utils.set_random_seed(1)
model = create_model()
initial = model.get_weights()
compile_model(model)
history = model.fit(dataset, epochs=1, verbose=0)
evaluated = model.evaluate(dataset, verbose=0)
after_fit = model.get_weights()
history2 = model.fit(data_parallel.distribute_dataset(dataset), epochs=1, verbose=0)

# ---- The test's part: one process, no distribution, the same initial weights and batches.
keras.distribution.set_distribution(None)
reference = create_model()
reference.set_weights(initial)
compile_model(reference)
reference_history = reference.fit(dataset, epochs=1, verbose=0)
reference_after_fit = reference.get_weights()
reference.fit(dataset, epochs=1, verbose=0)


def gap(a, b):
    return float(max(np.max(np.abs(u - v)) for u, v in zip(a, b, strict=True)))


result = {
    "devices": devices, "num_processes": data_parallel.num_processes,
    "replicas": int(model.distribute_strategy.num_replicas_in_sync),
    "loss": history.history["loss"], "reference_loss": reference_history.history["loss"],
    "evaluated": evaluated, "fit_gap": gap(after_fit, reference_after_fit),
    "distributed_dataset_gap": gap(model.get_weights(), reference.get_weights()),
    "moved": gap(reference_after_fit, initial), "weights": [w.tolist() for w in after_fit],
}
task = json.loads(os.environ.get("TF_CONFIG", '{"task": {"type": "worker", "index": 0}}'))["task"]
out_dir = os.environ.get("TFDIST_RESULT_DIR", ".")
with open(os.path.join(out_dir, f"{task['type']}_{task['index']}.json"), "w") as file:
    json.dump(result, file)
