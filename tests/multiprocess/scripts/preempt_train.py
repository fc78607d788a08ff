"""Multi-worker fit for the preemption tests: every step sees different data, so a run resumed at
the wrong step, or with its input at the wrong place, ends with different weights.

Argument: the backup directory. Environment:

* ``PAUSE_AT_STEP=k``: after global step k (1-based) every worker prints ``paused after step k``
  and waits 5 s (the test sends SIGTERM meanwhile), or, where it saves on SIGTERM, until its
  SIGTERM came (`pause.pause_until_sigterm`). Off when unset.
* ``SAVE_BEFORE_PREEMPTION=0``: the backup callback does not save on SIGTERM (sabotage).
* ``NO_INPUT_RESUME=1``: a resumed run starts its input at the first batch (sabotage).
* ``STEPS_PER_EXECUTION=n``: compile with it (default 1).

Reports the (epoch, step) of every step it ran and the final weights.
"""

import os
import sys
import time

import numpy as np
from pause import pause_until_sigterm

import tfdist
import tfdist.testing
from tfdist.core import flavour

EPOCHS, STEPS, PER_REPLICA = 3, 8, 4

keras = flavour.get_keras()
strategy = tfdist.get_strategy("multi_worker")
global_batch = strategy.global_batch_size(PER_REPLICA)
rng = np.random.default_rng(11)
# Three epochs' worth of distinct batches: an endless stream whose position is the global step.
x = rng.normal(size=(EPOCHS * STEPS * global_batch, 5)).astype("float32")
y = (x @ rng.normal(size=(5, 1)) + 0.3).astype("float32")
if os.environ.get("NO_INPUT_RESUME") == "1":
    strategy._resume_input_at = lambda step: None


def dataset_fn(context):
    import tensorflow as tf

    batch = context.get_per_replica_batch_size(global_batch)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True)


class Steps(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.ran = []
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.ran.append([self.epoch, int(batch)])  # the first step of each execution

    def on_train_batch_end(self, batch, logs=None):
        pause_at = int(os.environ.get("PAUSE_AT_STEP", "0"))
        if self.epoch * STEPS + batch + 1 == pause_at:
            print(f"paused after step {pause_at}", flush=True)
            if save:
                pause_until_sigterm()
            else:  # TF's runtime goes on after SIGTERM: the test needs the grace to run out
                time.sleep(5)


with strategy.scope():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse",
                  steps_per_execution=int(os.environ.get("STEPS_PER_EXECUTION", "1")))
save = os.environ.get("SAVE_BEFORE_PREEMPTION", "1") == "1"
steps = Steps()
model.fit(
    strategy.distribute_dataset(dataset_fn), epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0,
    callbacks=[strategy.backup_callback(sys.argv[1], save_before_preemption=save), steps],
)
tfdist.testing.report({"ran": steps.ran, "weights": [w.tolist() for w in model.get_weights()]})
