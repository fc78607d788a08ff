"""One training script for every Slurm job under test, and for the local run it is compared with.

Usage: ``python slurm_train.py REPLICAS``. The strategy is the job's (``TFDIST_STRATEGY``, set by
the exported script), or the default one when run alone. Every process starts from the same
seed, so the local run and each replica begin with the same weights; the data is
``STEPS`` global batches of ``PER_REPLICA * REPLICAS`` rows, the same batches everywhere.

Reports the loss over all the data (numpy, outside any strategy) before and after training, the
final weights, and where the task ran (``SLURMD_NODENAME``, ``SLURM_PROCID``, the network
namespace).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import parity_lib
import tensorflow as tf

import tfdist
from tfdist.core import flavour
from tfdist.testing import report

PER_REPLICA, STEPS, EPOCHS = 4, 5, 2

keras = flavour.get_keras()
strategy = tfdist.get_strategy()
replicas = int(sys.argv[1])
global_batch = PER_REPLICA * replicas
x, y = parity_lib.make_data(global_batch * STEPS)


def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    batch = ctx.get_per_replica_batch_size(global_batch)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()


def full_data_loss(weights: list[np.ndarray]) -> float:
    """Mean squared error of the Dense(4, tanh) -> Dense(1) model over all of x, in numpy."""
    w1, b1, w2, b2 = weights
    return float(np.mean((np.tanh(x @ w1 + b1) @ w2 + b2 - y) ** 2))


keras.utils.set_random_seed(0)
with strategy.scope():
    model = parity_lib.build_model(keras)
initial = model.get_weights()
tfdist.fit(model, strategy.distribute_dataset(dataset_fn), epochs=EPOCHS,
           steps_per_epoch=STEPS, verbose=0)
weights = [np.asarray(w) for w in model.get_weights()]
report({
    "first_loss": full_data_loss(initial),
    "final_loss": full_data_loss(weights),
    "weights": parity_lib.as_lists(weights),
    "replicas": strategy.num_replicas_in_sync,
    "node": os.environ.get("SLURMD_NODENAME"),
    "procid": os.environ.get("SLURM_PROCID"),
    "netns": os.stat("/proc/self/ns/net").st_ino,
})
