"""Multi-worker fit with BackupAndRestore on deterministic data, for the gang-restart test.

Every epoch sees the same batches in the same order (no shuffle; one pass per epoch), so a run
resumed from the backup of epoch k computes exactly what an uninterrupted run computes.
With ``KILL_AFTER_EPOCH=k``, worker:1 SIGKILLs itself right after epoch k is backed up, on the
first attempt only (a marker file in ``MARKER_DIR`` remembers the kill).
"""

import os
import signal
import sys

import numpy as np

import tfdist
import tfdist.testing
from tfdist.core import flavour

EPOCHS, STEPS, PER_REPLICA = 4, 6, 8

keras = flavour.get_keras()
strategy = tfdist.get_strategy("multi_worker")
global_batch = strategy.global_batch_size(PER_REPLICA)
rng = np.random.default_rng(7)
x = rng.normal(size=(STEPS * global_batch, 5)).astype("float32")
y = (x @ rng.normal(size=(5, 1)) + 0.3).astype("float32")


def dataset_fn(context):
    import tensorflow as tf

    batch = context.get_per_replica_batch_size(global_batch)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True)


class KillAfterEpoch(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        kill_after = int(os.environ.get("KILL_AFTER_EPOCH", "0"))
        marker = os.path.join(os.environ.get("MARKER_DIR", "."), "killed")
        if epoch + 1 == kill_after and strategy.task == tfdist.Task("worker", 1):
            if not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)


with strategy.scope():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
history = model.fit(
    strategy.distribute_dataset(dataset_fn), epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0,
    callbacks=[strategy.backup_callback(sys.argv[1]), KillAfterEpoch()],
)
tfdist.testing.report({
    "epochs_run": [e + 1 for e in history.epoch],
    "weights": [w.tolist() for w in model.get_weights()],
})
