"""A 2-process model-parallel job with per-rank BackupAndRestore, for the resume tests: a
2-stage pipeline, or (``TFDIST_STRATEGY=tensor``) two tensor shards.

Arg: the backup directory. Every epoch sees the same batches in the same order, so a job resumed
from the backups of epoch k computes what an uninterrupted job computes. With
``KILL_IN_EPOCH=k`` (1-based) the last stage (the last shard) SIGKILLs itself after the first
step of epoch k, on the first attempt only (a marker file in ``MARKER_DIR``). That step needed
stage 0's activations (shard 0's all-reduce), which it sent after its end-of-epoch backup: every
process has backed up epoch k-1 when the kill comes.
"""

import os
import signal
import sys

import numpy as np

import tfdist
import tfdist.testing
from tfdist.core import flavour

EPOCHS, STEPS, GLOBAL = 3, 4, 8

keras = flavour.get_keras()
tensor = os.environ.get("TFDIST_STRATEGY") == "tensor"
strategy = tfdist.get_strategy("auto", **({} if tensor else {"micro_batches": 2}))
rng = np.random.default_rng(7)
x = rng.normal(size=(STEPS * GLOBAL, 5)).astype("float32")
y = (np.tanh(x @ rng.normal(size=(5, 1))) + 0.3).astype("float32")


class KillInEpoch(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        kill_in = int(os.environ.get("KILL_IN_EPOCH", "0"))
        marker = os.path.join(os.environ.get("MARKER_DIR", "."), "killed")
        last = strategy.worker_index == strategy.num_workers - 1
        if self.epoch + 1 == kill_in and batch == 0 and last and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


def build():
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh", name="a"),
                             keras.layers.Dense(6, activation="tanh", name="b"),
                             keras.layers.Dense(1, name="c")], name="mlp")


keras.utils.set_random_seed(3)
model = strategy.build_model(build())
# Adam: its moments and step count must come back from the backup too.
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
backup = strategy.backup_callback(sys.argv[1])
history = model.fit(x, y, batch_size=GLOBAL, epochs=EPOCHS, shuffle=False, verbose=0,
                    callbacks=[backup, KillInEpoch()])
weights = strategy.gather_weights(model)
if tensor:  # every layer's whole weights on every shard: the chief reports them in model order
    weights = [w for layer in model.layers for w in weights.get(layer.name, [])]
    weights = weights if strategy.is_chief else None
tfdist.testing.report({
    "epochs_run": [e + 1 for e in history.epoch],
    "backup_dir": backup.backup_dir,
    "rank": strategy.worker_index,
    "weights": None if weights is None else [w.tolist() for w in weights],
})
