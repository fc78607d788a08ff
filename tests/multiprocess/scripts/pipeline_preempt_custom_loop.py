"""A 2-stage pipeline custom loop (``strategy.train_step``) with the pipeline's preemption
handler. Argument: the checkpoint directory. ``PAUSE_AT_STEP=k``: after step k the last stage
prints ``paused after step k`` and waits until its SIGTERM comes (at most 4 s) before the
handler's vote. Reports the steps it ran and the whole model's weights (chief)."""

import os
import sys

import numpy as np
import tensorflow as tf
from pause import pause_until_sigterm

import tfdist
import tfdist.testing
from tfdist.core import flavour

TOTAL, GLOBAL = 12, 8

keras = flavour.get_keras()
strategy = tfdist.get_strategy("auto", micro_batches=2)
rng = np.random.default_rng(5)
x = rng.normal(size=(TOTAL * GLOBAL, 5)).astype("float32")
y = (np.tanh(x @ rng.normal(size=(5, 1))) + 0.3).astype("float32")
keras.utils.set_random_seed(3)
model = strategy.build_model(keras.Sequential(
    [keras.Input((5,)), keras.layers.Dense(8, activation="tanh", name="a"),
     keras.layers.Dense(1, name="c")], name="mlp"))
optimizer = keras.optimizers.Adam(0.01)
step = strategy.train_step(model, "mse", optimizer)
handler = strategy.preemption_handler(tf.train.Checkpoint(model=model, optimizer=optimizer),
                                      sys.argv[1])
last_stage = strategy.layout.stage == strategy.stages - 1
pause_at = int(os.environ.get("PAUSE_AT_STEP", "0"))
ran = []


def paused_step(xb, yb):
    loss = step(xb, yb)
    if last_stage and handler.total_run_calls + 1 == pause_at:
        print(f"paused after step {pause_at}", flush=True)
        pause_until_sigterm(4)
    return loss


while handler.total_run_calls < TOTAL:
    i = handler.total_run_calls
    ran.append(i + 1)
    handler.run(paused_step, x[i * GLOBAL:(i + 1) * GLOBAL], y[i * GLOBAL:(i + 1) * GLOBAL])
handler.stop()
weights = strategy.gather_weights(model)
tfdist.testing.report({"ran": ran,
                       "weights": None if weights is None else [w.tolist() for w in weights]})
