"""A 2-stage pipeline fit for the preemption test: every step of an epoch sees a different batch
(the same each epoch), so a rerun resumed at the wrong step, or with its input at the wrong
batch, ends with different weights.

Argument: the backup directory. ``PAUSE_AT_STEP=k``: after global step k (1-based) the last
stage prints ``paused after step k`` and waits until its SIGTERM comes (at most 4 s) before
its backup callback runs: the other stage is then already past step k, waiting in the vote
(or, were there no vote, in step k + 1). Reports the (epoch, batch) of every step fit called,
the optimizer's step count, the threads added after step 2 and the whole model's weights
(chief).
"""

import os
import sys

import numpy as np
from pause import pause_until_sigterm

import tfdist
import tfdist.testing
from tfdist.core import flavour

EPOCHS, STEPS, GLOBAL = 3, 4, 8

keras = flavour.get_keras()
strategy = tfdist.get_strategy("auto", micro_batches=2)
rng = np.random.default_rng(5)
x = rng.normal(size=(STEPS * GLOBAL, 5)).astype("float32")
y = (np.tanh(x @ rng.normal(size=(5, 1))) + 0.3).astype("float32")


class Steps(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.ran, self.epoch, self.threads_after_two = [], 0, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.ran.append([self.epoch, int(batch)])

    def on_train_batch_end(self, batch, logs=None):
        if len(self.ran) == 2:  # traced and warm: from here on no step may leave a thread
            self.threads_after_two = len(os.listdir("/proc/self/task"))
        pause_at = int(os.environ.get("PAUSE_AT_STEP", "0"))
        last_stage = strategy.layout.stage == strategy.stages - 1
        if last_stage and self.epoch * STEPS + batch + 1 == pause_at:
            print(f"paused after step {pause_at}", flush=True)
            pause_until_sigterm(4)


def build():
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh", name="a"),
                             keras.layers.Dense(6, activation="tanh", name="b"),
                             keras.layers.Dense(1, name="c")], name="mlp")


keras.utils.set_random_seed(3)
model = strategy.build_model(build())
# Adam: its moments and step count must come back from the checkpoint too.
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
steps = Steps()
backup = strategy.backup_callback(sys.argv[1], delete_checkpoint=False)
model.fit(x, y, batch_size=GLOBAL, epochs=EPOCHS, shuffle=False, verbose=0,
          callbacks=[steps, backup])
weights = strategy.gather_weights(model)
tfdist.testing.report({
    "ran": steps.ran,
    "iterations": int(model.optimizer.iterations.numpy()),
    "threads_added": len(os.listdir("/proc/self/task")) - steps.threads_after_two,
    "weights": None if weights is None else [w.tolist() for w in weights],
})
