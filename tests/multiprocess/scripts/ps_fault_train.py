"""ParameterServer chief for the launcher fault tests: a long fit with progress markers.

Usage: ``python ps_fault_train.py EPOCHS STEPS_PER_EPOCH``. After each epoch it writes
``$MARKER_DIR/epoch.<n>``; at the end ``$MARKER_DIR/result.json`` with the epochs the fit ran, the
losses, and the steps each worker ran, per epoch (a variable on the ps, bumped at
``[worker]`` in each train step by the worker that ran it).

It trains with ``tfdist.fit``: tf-keras's ``model.fit`` under TF_USE_LEGACY_KERAS=1, tfdist's
ClusterCoordinator loop under Keras 3.

Rejoin mode (``UNTIL_REJOINED=1``): EPOCHS is an upper bound. Once the test has killed worker:1
and written ``$MARKER_DIR/killed``, the next epoch end records worker:1's count as the baseline,
and training stops as soon as worker:1 has run 20 steps more than that: steps only the restarted
process can have run.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

import tfdist
import tfdist.strategies
from tfdist.core import flavour

EPOCHS, STEPS_PER_EPOCH = int(sys.argv[1]), int(sys.argv[2])
MARKERS = Path(os.environ["MARKER_DIR"])
keras = flavour.get_keras()
strategy = tfdist.strategies.get_strategy("parameter_server", startup_timeout_seconds=60)
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")).astype("float32")


class StepCounter(keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(1)
        self.steps = tf.Variable(tf.zeros([2], tf.int64), trainable=False, name="steps")

    def call(self, inputs):
        return self.dense(inputs)

    def train_step(self, data):
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        self.steps.assign_add(tf.one_hot(worker, 2, dtype=tf.int64))
        return super().train_step(data)


class Markers(keras.callbacks.Callback):
    steps: list[list[int]] = []  # cumulative steps per worker, after each epoch
    baseline: int | None = None  # rejoin mode: worker:1's count after it was killed

    def on_epoch_end(self, epoch, logs=None):
        steps = self.model.steps.numpy().tolist()
        self.steps.append(steps)
        (MARKERS / f"epoch.{epoch}").write_text(json.dumps(logs or {}, default=float))
        print(f"epoch {epoch} done", flush=True)
        if os.environ.get("UNTIL_REJOINED") and (MARKERS / "killed").exists():
            if Markers.baseline is None:
                Markers.baseline = steps[1]
            elif steps[1] >= Markers.baseline + 20:
                self.model.stop_training = True


def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64).batch(8).repeat()


with strategy.scope():
    model = StepCounter()
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    model.build((None, 4))
history = tfdist.fit(model, strategy.distribute_dataset(dataset_fn), epochs=EPOCHS,
                     steps_per_epoch=STEPS_PER_EPOCH, callbacks=[Markers()], verbose=0)
result = {"epochs": len(history.history["loss"]), "loss": history.history["loss"],
          "steps": Markers.steps, "baseline": Markers.baseline}
(MARKERS / "result.json").write_text(json.dumps(result))
print(f"fit done: {result}", flush=True)
