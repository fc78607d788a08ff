"""Replica parity under ``horovodrun -np 2``: ``python parity.py MODE...`` (``optimizer``,
``strategy``, and the other scripts' ``collectives`` and ``chief_writes=DIR``; each mode in
turn, one launch, reported by mode).

Every rank builds its model from a different seed (so only a broadcast can make them equal),
trains a few SGD steps, and reports its weights; rank 0 also trains a single-process reference
on the whole global batch of every step, from its own initial weights, in the same order.

* ``optimizer``: no strategy. Rank r fits on rows [r*B, (r+1)*B) of every global batch of 2B
  with `tfdist.horovod.DistributedOptimizer` (plain and fp16) + the broadcast and metric-average
  callbacks. Control: the same with a plain SGD (broadcast only).
* ``strategy``: `HorovodStrategy` from the registry; model built and compiled in its scope, and
  ``fit`` gets the whole data with the global batch and no broadcast callback. Again with
  ``compression="fp16"`` and ``strategy.callbacks()``. Control: each rank alone under
  ``tf.distribute.OneDeviceStrategy`` on its half.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import tensorflow as tf

import tfdist.horovod as thvd
import tfdist.strategies
from tfdist.core.flavour import flavour_of, get_keras, keras_flavour
from tfdist.testing import report

keras = get_keras()
PER_RANK, STEPS, EPOCHS, LR, FEATURES = 4, 3, 2, 0.1, 5


def build(seed: int):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(2)])


def weights(model) -> list:
    return [w.tolist() for w in model.get_weights()]


def rank_rows(rank: int, size: int, n: int) -> np.ndarray:
    """Rows of rank ``rank``'s half of every global batch, in order."""
    global_batch = PER_RANK * size
    return np.concatenate([np.arange(start + rank * PER_RANK, start + (rank + 1) * PER_RANK)
                           for start in range(0, n, global_batch)])


def reference(init: list, x: np.ndarray, y: np.ndarray, global_batch: int) -> dict:
    model = build(0)
    model.set_weights([np.array(w, dtype="float32") for w in init])
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    history = model.fit(x, y, batch_size=global_batch, epochs=EPOCHS, shuffle=False, verbose=0)
    return {"weights": weights(model), "loss": history.history["loss"]}


def fit_with_optimizer(optimizer, x, y, rank: int, callbacks: list) -> dict:
    model = build(100 + rank)
    init = weights(model)
    model.compile(optimizer=optimizer, loss="mse")
    history = model.fit(x, y, batch_size=PER_RANK, epochs=EPOCHS, shuffle=False, verbose=0,
                        callbacks=callbacks)
    return {"init": init, "weights": weights(model), "loss": history.history["loss"]}


def optimizer_mode(x, y, rank: int, size: int) -> dict:
    rows = rank_rows(rank, size, len(x))
    out = {"rows": rows.tolist()}
    callbacks = [thvd.BroadcastVariablesCallback(), thvd.MetricAverageCallback()]
    out["synced"] = fit_with_optimizer(
        thvd.DistributedOptimizer(keras.optimizers.SGD(LR)), x[rows], y[rows], rank, callbacks)
    out["fp16"] = fit_with_optimizer(
        thvd.DistributedOptimizer(keras.optimizers.SGD(LR), compression="fp16"), x[rows], y[rows],
        rank, [thvd.BroadcastVariablesCallback()])
    out["control"] = fit_with_optimizer(keras.optimizers.SGD(LR), x[rows], y[rows], rank,
                                        [thvd.BroadcastVariablesCallback()])
    return out


def strategy_mode(x, y, rank: int, size: int) -> dict:
    strategy = tfdist.strategies.get_strategy("horovod")
    global_batch = strategy.global_batch_size(PER_RANK)
    with strategy.scope():
        model = build(100 + rank)
        model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    init = weights(model)
    history = model.fit(x, y, batch_size=global_batch, epochs=EPOCHS, shuffle=False, verbose=0,
                        callbacks=[thvd.MetricAverageCallback()])
    ids = tf.data.Dataset.range(2 * global_batch).batch(global_batch)
    seen = [b.numpy().tolist() for b in strategy.experimental_distribute_dataset(ids)]
    out = {"init": init, "weights": weights(model), "loss": history.history["loss"],
           "seen_ids": seen, "replicas": strategy.num_replicas_in_sync,
           "is_chief": strategy.is_chief, "global_batch": global_batch,
           "reduce_sum": float(strategy.reduce("SUM", tf.constant(rank + 1.0), axis=None))}
    fp16 = tfdist.strategies.get_strategy("horovod", compression="fp16")
    with fp16.scope():
        model = build(100 + rank)
        model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    model.fit(x, y, batch_size=global_batch, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=fp16.callbacks())
    out["fp16"] = {"weights": weights(model)}
    control_strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    rows = rank_rows(rank, size, len(x))
    with control_strategy.scope():
        control = build(100 + rank)
        control.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    control_init = weights(control)
    control.fit(x[rows], y[rows], batch_size=PER_RANK, epochs=EPOCHS, shuffle=False, verbose=0)
    out["control"] = {"init": control_init, "weights": weights(control)}
    return out


def run_mode(mode: str, x: np.ndarray, y: np.ndarray, rank: int, size: int) -> dict:
    """One mode's report (rank 0's with its one-process reference); ``collectives`` and
    ``chief_writes=DIR`` run those scripts' checks (one launch for all their tests)."""
    if mode == "collectives":
        from collectives import collectives  # this folder: the script's path[0]

        return collectives()
    if mode.startswith("chief_writes="):
        from chief_writes import chief_writes

        return chief_writes(mode.split("=", 1)[1])
    started = time.time()
    out = (optimizer_mode if mode == "optimizer" else strategy_mode)(x, y, rank, size)
    if rank == 0:
        init = out["init"] if mode == "strategy" else out["synced"]["init"]
        out["reference"] = reference(init, x, y, PER_RANK * size)
    out.update(flavour=keras_flavour(), model_flavour=flavour_of(build(0)), size=size,
               seconds=time.time() - started)
    return out


def main(modes: list[str]) -> None:
    thvd.init()
    rank, size = thvd.rank(), thvd.size()
    rng = np.random.RandomState(0)
    x = rng.randn(PER_RANK * size * STEPS, FEATURES).astype("float32")
    y = rng.randn(PER_RANK * size * STEPS, 2).astype("float32")
    report({mode: run_mode(mode, x, y, rank, size) for mode in modes})


if __name__ == "__main__":
    main(sys.argv[1:])
