"""HorovodStrategy (Keras 3 or tf-keras) for the multi-host test: a few steps, then report.

Run once per rank by ``tfdist-launch --strategy horovod --hosts ...`` (``horovodrun`` over ssh).
Each rank builds its model from its own seed, so only the strategy's broadcast makes the ranks
start equal. Reports the initial and final weights, Horovod's size, TF_CONFIG (which must be
unset), and the inode of this process's network namespace (so the test can check that each
rank ran on its own fake host); rank 0 also reports a single-process reference trained on the
whole global batch of every step from the same initial weights.
"""

from __future__ import annotations

import os

import parity_lib

import tfdist
from tfdist.core import flavour
from tfdist.testing import report

PER_REPLICA, STEPS = 4, 3

keras = flavour.get_keras()
strategy = tfdist.get_strategy("horovod")
rank = strategy.task.index
keras.utils.set_random_seed(100 + rank)
global_batch = strategy.global_batch_size(PER_REPLICA)
x, y = parity_lib.make_data(global_batch * STEPS)

with strategy.scope():
    model = parity_lib.build_model(keras)
initial = model.get_weights()
model.fit(x, y, batch_size=global_batch, epochs=1, shuffle=False, verbose=0)
result = {
    "size": strategy.num_replicas_in_sync,
    "tf_config": os.environ.get("TF_CONFIG"),
    "netns": os.stat("/proc/self/ns/net").st_ino,
    "initial": parity_lib.as_lists(initial),
    "weights": parity_lib.as_lists(model.get_weights()),
}
if rank == 0:
    result["reference"] = parity_lib.as_lists(
        parity_lib.reference_weights(keras, initial, x, y, global_batch))
report(result)
