"""One process of a 2-shard tensor job (T=2) whose replicated layers hold an unseeded
``Dropout`` before a ``LayerNormalization``; each process seeds itself differently (the
mistake of no common seed, made certain). Three models in one launch, each fit 6 steps:

* ``agreed``: as tfdist builds it (the shards' seed generators agreed over the tensor group);
  reports its LayerNorm weights;
* ``silent``: the agreement sabotaged (each shard keeps its own seed) and the weight check off;
  reports its LayerNorm weights (they drift apart: the silent divergence the issue measured);
* ``caught``: the agreement sabotaged, the weight check every 2 steps; reports the error that
  stops it.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import tensorflow as tf

import tfdist
from tfdist.parallel.consistency import CHECK_EVERY_ENV
from tfdist.strategies.tensor import TensorStrategy
from tfdist.testing import exit_after_report, report


def build() -> keras.Model:
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu", name="up")(inputs)
    hidden = keras.layers.Dense(8, name="down")(hidden)
    hidden = keras.layers.Dropout(0.5, name="drop")(hidden)
    hidden = keras.layers.LayerNormalization(name="norm")(hidden)
    return keras.Model(inputs, keras.layers.Dense(1, name="head")(hidden))


def fit(strategy: TensorStrategy, every: int) -> keras.Model:
    os.environ[CHECK_EVERY_ENV] = str(every)
    model = strategy.build_model(build)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    rng = np.random.default_rng(0)  # the same data everywhere: only the draws differ
    x, y = rng.normal(size=(48, 8)).astype("float32"), rng.normal(size=(48, 1)).astype("float32")
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    return model


def norm(model: keras.Model) -> list[list[float]]:
    return [np.asarray(w).tolist() for w in model.get_layer("norm").get_weights()]


def main() -> None:
    strategy = tfdist.get_strategy("auto")
    keras.utils.set_random_seed(100 + strategy.worker_index)  # each process its own seed
    result = {"agreed": norm(fit(strategy, 2))}
    TensorStrategy._agree_seeds = lambda self, model: None  # the sabotage  # noqa: SLF001
    result["silent"] = norm(fit(strategy, 0))
    try:
        fit(strategy, 2)
        result["caught"] = None
    except tf.errors.InvalidArgumentError as error:
        result["caught"] = error.message
    report(result)
    exit_after_report()


if __name__ == "__main__":
    main()
