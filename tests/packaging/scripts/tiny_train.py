"""Trains y = 3x + 1 with one Dense unit for a few steps under ``tfdist.get_strategy("auto")``.

Prints one line, ``TINY_TRAIN {json}``, with this task, the worker count, the Keras in use, the
loss before and after training and the learned weights.
"""

import json

import numpy as np

import tfdist
from tfdist.core.flavour import get_keras, keras_flavour

strategy = tfdist.get_strategy("auto")
keras = get_keras()
x = np.linspace(-1.0, 1.0, 64, dtype="float32").reshape(-1, 1)
y = 3.0 * x + 1.0
with strategy.scope():
    model = keras.Sequential([keras.Input(shape=(1,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.2), loss="mse")
before = float(model.evaluate(x, y, batch_size=64, verbose=0))
history = model.fit(x, y, batch_size=strategy.global_batch_size(8), epochs=8, verbose=0)
kernel, bias = (float(np.ravel(w)[0]) for w in model.get_weights())
print("TINY_TRAIN " + json.dumps({
    "task": str(strategy.task), "num_workers": strategy.num_workers, "keras": keras_flavour(),
    "loss_before": before, "loss_after": float(history.history["loss"][-1]),
    "kernel": kernel, "bias": bias,
}), flush=True)
