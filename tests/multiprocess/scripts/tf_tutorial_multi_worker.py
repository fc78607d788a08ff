"""TensorFlow's multi-worker tutorials, as a user brings them: no tfdist import anywhere.

Part 1 follows "Multi-worker training with Keras" (its ``main.py``): the script makes its own
``tf.distribute.MultiWorkerMirroredStrategy()``, builds and compiles the model under its scope and
calls ``model.fit`` on a batched dataset that tf.data auto-shards by element. Part 2 follows
"Custom training loop with Keras and MultiWorkerMirroredStrategy": ``dataset_fn`` shards by
``input_context``, ``strategy.run`` a ``GradientTape`` step, ``tf.nn.compute_average_loss``.
Both use ``tf.keras`` (Keras 3, or tf-keras under ``TF_USE_LEGACY_KERAS=1``) and synthetic data
(nothing downloads here) without shuffling, so every global batch is the same rows as in one
process. After training, the same steps run in this process without the strategy from the same
initial weights: the reference. Each worker writes what it saw to ``TFDIST_RESULT_DIR``.
"""

import json
import os

import numpy as np
import tensorflow as tf

PER_WORKER_BATCH, STEPS, LEARNING_RATE = 4, 5, 0.1

tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
num_workers = len(tf_config.get("cluster", {}).get("worker", [None]))
task = tf_config.get("task", {"type": "worker", "index": 0})
global_batch_size = PER_WORKER_BATCH * num_workers

rng = np.random.default_rng(0)
x = rng.normal(size=(global_batch_size * STEPS, 6)).astype("float32")
y = (x @ rng.normal(size=(6, 1)) > 0).astype("int64").ravel()


def build_and_compile_model():
    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=(6,)),
        tf.keras.layers.Dense(8, activation="relu"),
        tf.keras.layers.Dense(2),
    ])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=LEARNING_RATE),
        metrics=["accuracy"])
    return model


def weights(model):
    return [w.tolist() for w in model.get_weights()]


strategy = tf.distribute.MultiWorkerMirroredStrategy()

# ---- Part 1: model.fit (the Keras tutorial's main.py)
multi_worker_dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch_size)
with strategy.scope():
    multi_worker_model = build_and_compile_model()
fit_initial = multi_worker_model.get_weights()
history = multi_worker_model.fit(multi_worker_dataset, epochs=1, steps_per_epoch=STEPS,
                                 verbose=0)

# ---- Part 2: the custom training loop tutorial
def dataset_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset.batch(batch_size)


with strategy.scope():
    ctl_model = build_and_compile_model()
    optimizer = tf.keras.optimizers.SGD(learning_rate=LEARNING_RATE)
ctl_initial = ctl_model.get_weights()
loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


@tf.function
def train_step(iterator):
    def step_fn(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            predictions = ctl_model(features, training=True)
            per_example_loss = loss_object(labels, predictions)
            loss = tf.nn.compute_average_loss(per_example_loss,
                                              global_batch_size=global_batch_size)
        grads = tape.gradient(loss, ctl_model.trainable_variables)
        optimizer.apply_gradients(zip(grads, ctl_model.trainable_variables, strict=True))
        return loss

    per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
ctl_losses = [float(train_step(iterator)) for _ in range(STEPS)]

# ---- The reference: the same steps in this process, no strategy, same initial weights.
global_dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch_size)
reference = build_and_compile_model()
reference.set_weights(fit_initial)
reference.fit(global_dataset, epochs=1, steps_per_epoch=STEPS, verbose=0)
ctl_reference = build_and_compile_model()
ctl_reference.set_weights(ctl_initial)
ctl_reference.fit(global_dataset, epochs=1, steps_per_epoch=STEPS, verbose=0)

result = {
    "keras": type(multi_worker_model).__module__.split(".")[0],
    "num_replicas": strategy.num_replicas_in_sync,
    "fit": weights(multi_worker_model), "fit_loss": history.history["loss"],
    "fit_reference": weights(reference), "fit_initial": [w.tolist() for w in fit_initial],
    "ctl": weights(ctl_model), "ctl_losses": ctl_losses,
    "ctl_reference": weights(ctl_reference),
}
path = os.path.join(os.environ["TFDIST_RESULT_DIR"], f"{task['type']}_{task['index']}.json")
with open(path + ".tmp", "w") as file:
    json.dump(result, file)
os.replace(path + ".tmp", path)
