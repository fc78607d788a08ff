"""One process of a 2-stage pipeline job (K=2) given data of its own (numpy drawn from a seed
per process: the mistake of an unseeded shuffle, made certain); fits 2 steps. Stage 0 reads x,
stage 1 reads y: without a check, stage 0's x trains against stage 1's y. The job must fail at
its first step naming the stage whose batch differs, what differs, and the fix."""

from __future__ import annotations

import numpy as np

import tfdist
from tfdist.core import flavour


def main() -> None:
    keras = flavour.get_keras()
    strategy = tfdist.get_strategy("auto")
    model = strategy.build_model(lambda: keras.Sequential([
        keras.Input((4,)), keras.layers.Dense(8, activation="tanh", name="d0"),
        keras.layers.Dense(1, name="out")]))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    rng = np.random.default_rng(strategy.worker_index)
    x, y = rng.normal(size=(16, 4)).astype("float32"), rng.normal(size=(16, 1)).astype("float32")
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    print("TRAINED ON DIFFERENT BATCHES", flush=True)


if __name__ == "__main__":
    main()
