"""ParameterServer, run on the chief: fit, then report losses, steps and placements.

With tf-keras (TF_USE_LEGACY_KERAS=1) ``tfdist.fit`` is tf-keras's ``model.fit``; with Keras 3 it
runs the steps through tfdist's ClusterCoordinator loop (`tfdist.training`).

Usage: ``python ps_train.py NUM_SHARDS`` (0: no partitioner). Each train step adds 1 to
``seen[0, 2 * worker + batch_id % 2]``, where ``worker`` is the worker that ran the step (TF's
``experimental_get_current_worker_index``) and ``batch_id`` the batch's position in the data:
steps per worker are the row sums, and correct sharding (worker w gets batches w, w+2, ...) puts
every count on the diagonal.
"""

from __future__ import annotations

import sys

import numpy as np
import parity_lib
import tensorflow as tf

import tfdist
import tfdist.strategies
from tfdist import training
from tfdist.core import flavour
from tfdist.testing import report

NUM_SHARDS = int(sys.argv[1])
BATCH, BATCHES, STEPS_PER_EPOCH, EPOCHS = 8, 8, 10, 3

keras = flavour.get_keras()
KERAS3 = flavour.keras_flavour() == "keras3"
options = {"num_shards": NUM_SHARDS} if NUM_SHARDS else {}
strategy = tfdist.strategies.get_strategy("parameter_server", startup_timeout_seconds=60, **options)
x, y = parity_lib.make_data(BATCH * BATCHES)


class CountingModel(keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = keras.layers.Dense(8, activation="tanh")
        self.out = keras.layers.Dense(1)
        self.seen = tf.Variable(tf.zeros([1, 4]), trainable=False, name="seen")

    def call(self, inputs):
        return self.out(self.hidden(inputs))

    def train_step(self, data):
        features, target, batch_id = data
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        self.seen.assign_add(tf.one_hot([2 * worker + batch_id[0] % 2], 4))
        with tf.GradientTape() as tape:
            prediction = self(features, training=True)
            if KERAS3:
                loss = training.track_loss(self, self.compute_loss(
                    x=features, y=target, y_pred=prediction), tf.shape(features)[0])
            else:
                loss = self.compiled_loss(target, prediction)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables, strict=True))
        return {m.name: m.result() for m in self.metrics}


def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    batch_ids = np.repeat(np.arange(BATCHES), BATCH)
    return tf.data.Dataset.from_tensor_slices((x, y, batch_ids)).batch(BATCH).repeat()


with strategy.scope():
    model = CountingModel()
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    model.build((None, parity_lib.FEATURES))


def whole_data_loss() -> float:
    """MSE of the whole data, computed on the chief (it reads the variables from the ps)."""
    return float(tf.reduce_mean(tf.square(model(x) - y)))


with strategy.scope():  # Keras 3 makes a subclassed model's layer variables at its first call
    initial_loss = whole_data_loss()
history = tfdist.fit(
    model, strategy.distribute_dataset(dataset_fn), epochs=EPOCHS,
    steps_per_epoch=STEPS_PER_EPOCH, verbose=0,
)


def tf_var(var):
    """The tf.Variable (or ShardedVariable) behind a variable of either Keras."""
    return var if isinstance(var, tf.Variable) or not hasattr(var, "path") else var._value


def name(var) -> str:
    return getattr(var, "path", None) or var.name  # Keras 3: "dense/kernel"


def shard_devices(var) -> list[str]:
    var = tf_var(var)
    return [v.device for v in getattr(var, "variables", [var])]


report({
    "num_workers": strategy.num_workers,
    "is_chief": strategy.is_chief,
    "loss": history.history["loss"],
    "whole_data_loss": [initial_loss, whole_data_loss()],
    "seen": model.seen.numpy().reshape(2, 2).tolist(),
    "devices": {name(v): shard_devices(v) for v in model.trainable_variables + [model.seen]},
    "kernel_shapes": [list(s.shape) for s in getattr(tf_var(model.hidden.kernel), "variables",
                                                     [])],
    "optimizer_devices": [d for v in training.optimizer_variables(model.optimizer)
                          for d in shard_devices(v)],
})
