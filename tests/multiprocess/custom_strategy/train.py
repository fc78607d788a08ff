"""Two steps of a tiny model under get_strategy("auto"); reports the class and the weights."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import tfdist
from tfdist.core import flavour
from tfdist.testing import report

keras = flavour.get_keras()
strategy = tfdist.get_strategy("auto")
global_batch = strategy.global_batch_size(4)
rng = np.random.default_rng(0)
x = rng.normal(size=(global_batch * 2, 3)).astype("float32")
y = x.sum(axis=1, keepdims=True)


def dataset_fn(ctx):
    batch = ctx.get_per_replica_batch_size(global_batch)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()


with strategy.scope():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
model.fit(strategy.distribute_dataset(dataset_fn), epochs=1, steps_per_epoch=2, verbose=0)
report({"class": type(strategy).__name__, "replicas": strategy.num_replicas,
        "weights": [w.tolist() for w in model.get_weights()]})
