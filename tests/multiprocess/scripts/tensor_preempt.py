"""A 2-shard tensor fit (T=2) for the tensor preemption test: every step of an epoch sees a
different batch (the same each epoch), so a rerun resumed at the wrong step, or with its input
at the wrong batch, ends with different weights.

Argument: the backup directory. ``PAUSE_AT_STEP=k``: after global step k (1-based) rank 1
prints ``paused after step k`` and waits until its SIGTERM comes (at most 4 s) before its
backup callback runs: rank 0 is then already past step k, waiting in the vote. Reports the
(epoch, batch) of every step fit called, the optimizer's step count and the whole model's
weights; with ``REFERENCE=1`` the chief also trains the model in one process, uninterrupted,
and reports its weights.
"""

import os
import sys

import keras
import numpy as np
from pause import pause_until_sigterm

import tfdist
import tfdist.testing

EPOCHS, STEPS, GLOBAL = 3, 4, 8

strategy = tfdist.get_strategy("auto")
rng = np.random.default_rng(5)
x = rng.normal(size=(STEPS * GLOBAL, 5)).astype("float32")
y = (np.tanh(x @ rng.normal(size=(5, 1))) + 0.3).astype("float32")


class Steps(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.ran, self.epoch = [], 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.ran.append([self.epoch, int(batch)])

    def on_train_batch_end(self, batch, logs=None):
        pause_at = int(os.environ.get("PAUSE_AT_STEP", "0"))
        if strategy.worker_index == 1 and self.epoch * STEPS + batch + 1 == pause_at:
            print(f"paused after step {pause_at}", flush=True)
            pause_until_sigterm(4)


def build():
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(8, activation="tanh", name="up")(inputs)
    hidden = keras.layers.Dense(6, name="down")(hidden)
    return keras.Model(inputs, keras.layers.Dense(1, name="head")(hidden), name="mlp")


keras.utils.set_random_seed(3)
model = strategy.build_model(build)
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")  # its moments come back too
steps = Steps()
backup = strategy.backup_callback(sys.argv[1], delete_checkpoint=False)
model.fit(x, y, batch_size=GLOBAL, epochs=EPOCHS, shuffle=False, verbose=0,
          callbacks=[steps, backup])
weights = strategy.gather_weights(model)
result = {"ran": steps.ran, "iterations": int(model.optimizer.iterations.numpy()),
          "weights": [np.asarray(w).tolist() for name in sorted(weights) for w in weights[name]]}
if strategy.is_chief and os.environ.get("REFERENCE"):  # one process, never interrupted
    keras.utils.set_random_seed(3)
    reference = build()
    reference.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    reference.fit(x, y, batch_size=GLOBAL, epochs=EPOCHS, shuffle=False, verbose=0)
    result["reference"] = [w.tolist() for name in sorted(weights)
                           for w in reference.get_layer(name).get_weights()]
tfdist.testing.report(result)
