"""MultiWorkerMirrored (tf-keras) for the multi-host test: a few steps, then report the weights.

Run once per worker by ``tfdist-launch --hosts ...``. Reports the final weights, the number of
workers, and the inode of this process's network namespace (so the test can check that the
workers really ran on different fake hosts).
"""

from __future__ import annotations

import os

import numpy as np
import parity_lib
import tensorflow as tf

import tfdist.strategies
from tfdist.core import flavour
from tfdist.testing import report

PER_REPLICA, STEPS = 4, 3

keras = flavour.get_keras()
strategy = tfdist.strategies.get_strategy(
    "multi_worker", implementation="ring", timeout_seconds=60, startup_timeout_seconds=60
)
global_batch = strategy.global_batch_size(PER_REPLICA)
x, y = parity_lib.make_data(global_batch * STEPS)


def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    batch = ctx.get_per_replica_batch_size(global_batch)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


with strategy.scope():
    model = parity_lib.build_model(keras)
initial = [np.asarray(w).tolist() for w in model.get_weights()]
model.fit(strategy.distribute_dataset(dataset_fn), epochs=1, steps_per_epoch=STEPS, verbose=0)
report({
    "num_workers": strategy.num_workers,
    "initial": initial,
    "weights": [np.asarray(w).tolist() for w in model.get_weights()],
    "netns": os.stat("/proc/self/ns/net").st_ino,
})
