"""Horovod's own API, written as Horovod's users write it, under ``horovodrun -np 2``.

``python horovod_api.py`` with the Keras flavour chosen by ``TF_USE_LEGACY_KERAS``. Imports
``horovod.tensorflow.keras as hvd`` (``horovod.tensorflow`` for custom loops) and
``from tensorflow import keras`` (Horovod's docs' way),
i.e. Horovod 0.28.1 as patched by ``launch/horovod-patches``. Ranks start from different
weights (seed 100 + rank) where a broadcast is under test; rank 0 also trains one-process
references on the whole global batches.

Reports, per rank:
* ``fit``: ``model.fit`` with ``hvd.DistributedOptimizer`` and the broadcast and metric-average
  callbacks, from equal weights; ``unwrapped``: the same with a plain optimizer (the control);
  ``broadcast``: as ``fit`` from different weights (Horovod's callback broadcasts after the first
  batch, so only the ranks' equality is checked).
* ``tape``: a custom loop with ``hvd.DistributedGradientTape`` and ``hvd.broadcast_variables``.
* ``warmup``: the learning rate after each epoch under ``LearningRateWarmupCallback``.
* ``syncbn``: ``hvd.SyncBatchNormalization``'s moving mean after one step on each rank's rows.
* ``elastic``: weights after ``hvd.elastic.KerasState`` commit, more training, and restore.
"""

from __future__ import annotations

import time

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from tensorflow import keras

from tfdist.core.flavour import flavour_of, keras_flavour
from tfdist.testing import report

START = time.time()
PER_RANK, STEPS, LR, FEATURES = 4, 3, 0.1, 5


def build(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(2)])


def weights(model: keras.Model) -> list:
    return [w.tolist() for w in model.get_weights()]


def rank_rows(rank: int, size: int, n: int) -> np.ndarray:
    global_batch = PER_RANK * size
    return np.concatenate([np.arange(start + rank * PER_RANK, start + (rank + 1) * PER_RANK)
                           for start in range(0, n, global_batch)])


def fit(optimizer, x, y, seed: int) -> dict:
    model = build(seed)
    init = weights(model)
    model.compile(optimizer=optimizer, loss="mse")
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback()]
    history = model.fit(x, y, batch_size=PER_RANK, epochs=2, shuffle=False, verbose=0,
                        callbacks=callbacks)
    loss = [float(v) for v in history.history["loss"]]
    return {"init": init, "weights": weights(model), "loss": loss}


def tape_loop(x, y, rank: int) -> dict:
    model = build(100 + rank)
    optimizer = keras.optimizers.SGD(LR)
    loss_fn = keras.losses.MeanSquaredError()
    hvd_tf.broadcast_variables(model.variables, root_rank=0)
    for step in range(STEPS):
        rows = slice(step * PER_RANK, (step + 1) * PER_RANK)
        with tf.GradientTape() as tape:
            loss = loss_fn(y[rows], model(x[rows], training=True))
        tape = hvd_tf.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return {"weights": weights(model)}


def warmup(x, y) -> list[float]:
    model = build(0)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), loss="mse")
    seen: list[float] = []
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: seen.append(float(logs["lr"])))
    callback = hvd.callbacks.LearningRateWarmupCallback(initial_lr=LR, warmup_epochs=2,
                                                        steps_per_epoch=STEPS)
    model.fit(x, y, batch_size=PER_RANK, epochs=3, shuffle=False, verbose=0,
              callbacks=[callback, record])
    return seen


def sync_batch_norm(x) -> list[float]:
    layer = hvd_tf.SyncBatchNormalization(momentum=0.0)
    layer(x, training=True)
    return np.asarray(layer.moving_mean).tolist()


def elastic(x, y, rank: int) -> dict:
    model = build(100 + rank)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), loss="mse")
    model.fit(x, y, batch_size=PER_RANK, epochs=1, shuffle=False, verbose=0)
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    state.sync()  # rank 0's model and optimizer state everywhere
    state.commit()
    committed = weights(model)
    model.fit(x, y, batch_size=PER_RANK, epochs=1, shuffle=False, verbose=0)
    trained = weights(model)
    state.restore()
    return {"committed": committed, "trained": trained, "restored": weights(model)}


def reference(init: list, x, y, global_batch: int) -> dict:
    model = build(0)
    model.set_weights([np.array(w, dtype="float32") for w in init])
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    history = model.fit(x, y, batch_size=global_batch, epochs=2, shuffle=False, verbose=0)
    tape_model = build(0)
    tape_model.set_weights([np.array(w, dtype="float32") for w in init])
    tape_model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    tape_model.fit(x, y, batch_size=global_batch, epochs=1, shuffle=False, verbose=0)
    return {"weights": weights(model), "loss": history.history["loss"], "tape": weights(tape_model)}


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    rng = np.random.RandomState(0)
    x = rng.randn(PER_RANK * size * STEPS, FEATURES).astype("float32")
    y = rng.randn(PER_RANK * size * STEPS, 2).astype("float32")
    rows = rank_rows(rank, size, len(x))
    out = {
        "fit": fit(hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), x[rows], y[rows], 100),
        "broadcast": fit(hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), x[rows], y[rows],
                         100 + rank),
        "unwrapped": fit(keras.optimizers.SGD(LR), x[rows], y[rows], 100),
        "tape": tape_loop(x[rows], y[rows], rank),
        "warmup": warmup(x[rows], y[rows]),
        "syncbn": sync_batch_norm(x[rows[:PER_RANK]]),
        "elastic": elastic(x[rows], y[rows], rank),
    }
    if rank == 0:
        out["reference"] = reference(out["fit"]["init"], x, y, PER_RANK * size)
        out["global_mean"] = x[: PER_RANK * size].mean(axis=0).tolist()
    out.update(flavour=keras_flavour(), model_flavour=flavour_of(build(0)), size=size,
               seconds=time.time() - START)
    report(out)


if __name__ == "__main__":
    main()
