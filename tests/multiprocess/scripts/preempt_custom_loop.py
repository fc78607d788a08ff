"""A multi-worker custom training loop with ``strategy.preemption_handler``, for the preemption
tests: each step sees different data (an endless stream), so resuming at the wrong step or input
position changes the final weights.

Argument: the checkpoint directory. ``PAUSE_AT_STEP=k``: after step k every worker prints
``paused after step k`` and waits until its SIGTERM came, at most 5 s
(`pause.pause_until_sigterm`). Reports the steps it ran and the final weights.
"""

import os
import sys

import numpy as np
import tensorflow as tf
from pause import pause_until_sigterm

import tfdist
import tfdist.testing
from tfdist.core import flavour

TOTAL_STEPS, PER_REPLICA = 24, 4

keras = flavour.get_keras()
strategy = tfdist.get_strategy("multi_worker")
global_batch = strategy.global_batch_size(PER_REPLICA)
rng = np.random.default_rng(5)
x = rng.normal(size=(TOTAL_STEPS * global_batch, 5)).astype("float32")
y = (x @ rng.normal(size=(5, 1)) - 0.2).astype("float32")


def dataset_fn(context):
    batch = context.get_per_replica_batch_size(global_batch)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True)


with strategy.scope():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    step = tf.Variable(0, dtype=tf.int64, trainable=False)
checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
handler = strategy.preemption_handler(checkpoint, sys.argv[1])  # restores; before the iterator
iterator = iter(strategy.distribute_dataset(dataset_fn))


@tf.function
def train_step(batch):
    def replica_step(features, labels):
        with tf.GradientTape() as tape:
            error = model(features, training=True) - labels
            loss = tf.reduce_sum(tf.square(error)) / global_batch
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    strategy.run(replica_step, args=batch)


ran = []
pause_at = int(os.environ.get("PAUSE_AT_STEP", "0"))
while step.numpy() < TOTAL_STEPS:
    handler.run(train_step, next(iterator))
    step.assign_add(1)
    ran.append(int(step.numpy()))
    if ran[-1] == pause_at:
        print(f"paused after step {pause_at}", flush=True)
        pause_until_sigterm()
tfdist.testing.report({"ran": ran, "weights": [w.tolist() for w in model.get_weights()]})
