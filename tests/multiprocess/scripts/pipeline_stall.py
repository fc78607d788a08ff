"""One process of a 2-stage pipeline job (K=2, no ``timeout_seconds``) in which stage 1 stalls
before its third batch, alive but never meeting stage 0 (as a deadlock between stages would).
The batch deadline of a pipeline set no timeout (`tfdist.pipeline.keras_model.STEP_TIMEOUT`) is
lowered to ``argv[1]`` seconds so the test need not wait the default's 10 minutes."""

from __future__ import annotations

import sys

import numpy as np
from pause import stall

import tfdist
import tfdist.pipeline.keras_model as pipeline_model
from tfdist.core import flavour

STALL_SECONDS = 120.0


def main(deadline: float) -> None:
    keras = flavour.get_keras()
    pipeline_model.STEP_TIMEOUT = deadline
    strategy = tfdist.get_strategy("auto")
    model = strategy.build_model(lambda: keras.Sequential([
        keras.Input((4,)), keras.layers.Dense(8, activation="tanh", name="d0"),
        keras.layers.Dense(1, name="out")]))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 4)).astype("float32"), rng.normal(size=(32, 1)).astype("float32")

    class Stall(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if strategy.layout.stage == 1 and batch == 2:
                print("STAGE 1 STALLS", flush=True)
                stall(STALL_SECONDS)

    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[Stall()])
    print("TRAINED THROUGH THE STALL", flush=True)


if __name__ == "__main__":
    main(float(sys.argv[1]))
