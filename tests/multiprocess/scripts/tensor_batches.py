"""One process of a 2-shard tensor job (T=2) given data of its own (numpy drawn from a seed per
process: the mistake of an unseeded shuffle, made certain); fits 2 steps. The job must fail at
its first step naming the inputs that differ and the fix."""

from __future__ import annotations

import keras
import numpy as np

import tfdist


def main() -> None:
    strategy = tfdist.get_strategy("auto")
    keras.utils.set_random_seed(3)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu", name="up")(inputs)
    hidden = keras.layers.Dense(8, name="down")(hidden)
    model = strategy.build_model(keras.Model(inputs, keras.layers.Dense(1, name="head")(hidden)))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    rng = np.random.default_rng(strategy.worker_index)
    x = rng.normal(size=(16, 8)).astype("float32")
    y = np.ones((16, 1), "float32")  # the same everywhere: only x differs
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    print("TRAINED ON DIFFERENT BATCHES", flush=True)


if __name__ == "__main__":
    main()
