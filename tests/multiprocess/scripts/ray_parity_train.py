"""MultiWorkerMirrored, a few steps: report the per-epoch loss and the final weights.

Run by ``tfdist-launch --workers 2`` on this machine and by ``tfdist-launch --ray`` (one Ray
actor per worker): same script, same data, same seed, so both runs must end with the same loss.
Each worker reports as ``worker:<i>`` (with the inode of its network namespace, which tells the
fake hosts of the two-node test apart); the test compares the runs.
"""

from __future__ import annotations

import os

import parity_lib
import tensorflow as tf

import tfdist.strategies
from tfdist.core import flavour
from tfdist.testing import report

PER_REPLICA, STEPS, EPOCHS = 4, 3, 2

keras = flavour.get_keras()
keras.utils.set_random_seed(7)
strategy = tfdist.strategies.get_strategy(
    "multi_worker", implementation="ring", timeout_seconds=60, startup_timeout_seconds=60
)
global_batch = strategy.global_batch_size(PER_REPLICA)
x, y = parity_lib.make_data(global_batch * STEPS)


def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    batch = ctx.get_per_replica_batch_size(global_batch)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()


with strategy.scope():
    model = parity_lib.build_model(keras)
history = model.fit(strategy.distribute_dataset(dataset_fn), epochs=EPOCHS,
                    steps_per_epoch=STEPS, verbose=0)
report({"num_workers": strategy.num_workers, "loss": history.history["loss"],
        "weights": parity_lib.as_lists(model.get_weights()),
        "netns": os.stat("/proc/self/ns/net").st_ino,
        "ray_token": "RAY_AUTH_TOKEN" in os.environ})
