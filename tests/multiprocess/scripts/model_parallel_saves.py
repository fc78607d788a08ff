"""One process of a 2-process tensor (T=2) or pipeline (2 stages) job that trains a tiny model
for 2 steps, then saves it three ways and reports what each did.

1. ``save_model`` on every process to an existing directory: the chief's error must name a
   rescue path holding the trained model.
2. ``save_model`` on every process to a good path: it must hold the weights of the same model
   trained in one process on the same batches, and the rescued model the same.
3. ``save_model`` on the chief only (the others go on to the end of the script): refused with
   the fix, within seconds, not after the 300 s collective deadline.
4. ``model.evaluate`` and ``model.predict`` on the chief only, after that: refused with the fix
   within seconds (each is a collective of every process; a peer that has ended was once
   noticed only when its heartbeats stopped, after about 85 s).

Args: ``OUT_DIR``. The strategy comes from ``TFDIST_STRATEGY`` (``tensor`` or ``pipeline``).
"""

from __future__ import annotations

import os
import re
import sys
import time

import keras
import numpy as np

import tfdist
from tfdist.errors import StrategyConfigError
from tfdist.testing import report


def build() -> keras.Model:
    keras.utils.set_random_seed(3)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu", name="up")(inputs)
    hidden = keras.layers.Dense(8, name="down")(hidden)
    return keras.Model(inputs, keras.layers.Dense(1, name="head")(hidden))


def weights_of(path: str) -> list[np.ndarray]:
    return [np.asarray(w) for w in keras.models.load_model(path, compile=False).get_weights()]


def train(model: keras.Model, x: np.ndarray, y: np.ndarray) -> None:
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)


def gap(first: list[np.ndarray], second: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(a - b))) for a, b in zip(first, second, strict=True))


def main(out_dir: str) -> None:
    strategy = tfdist.get_strategy("auto")
    model = strategy.build_model(build())
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 8)).astype("float32"), rng.normal(size=(16, 1)).astype("float32")
    train(model, x, y)
    result: dict = {}
    existing = os.path.join(out_dir, "existing.keras")
    os.makedirs(existing, exist_ok=True)
    try:
        strategy.save_model(model, existing)
        result["to_directory"] = "saved"
    except StrategyConfigError as err:
        result["to_directory"] = str(err)
    good = strategy.save_model(model, os.path.join(out_dir, "model.keras"))
    if strategy.is_chief:
        rescued = re.search(r"saved to (\S+) instead", result["to_directory"]).group(1)
        reference = build()
        train(reference, x, y)
        result["saved_gap"] = gap(weights_of(good), reference.get_weights())
        result["rescued_gap"] = gap(weights_of(rescued), weights_of(good))
        started = time.monotonic()
        try:
            strategy.save_model(model, os.path.join(out_dir, "chief_only.keras"))
            result["chief_only"] = "saved"
        except StrategyConfigError as err:
            result["chief_only"] = str(err)
        result["chief_only_s"] = time.monotonic() - started
        result |= chief_alone_calls(model, x, y)
    report(result)


def chief_alone_calls(model: keras.Model, x: np.ndarray, y: np.ndarray) -> dict:
    """``evaluate`` and ``predict`` on the chief alone (the other process has reached its end):
    what each raised (or "ran") and after how many seconds."""
    result = {}
    for method, args in (("evaluate", (x, y)), ("predict", (x,))):
        started = time.monotonic()
        try:
            getattr(model, method)(*args, batch_size=8, verbose=0)
            result[f"chief_only_{method}"] = "ran"
        except StrategyConfigError as err:
            result[f"chief_only_{method}"] = str(err)
        result[f"chief_only_{method}_s"] = time.monotonic() - started
    return result


if __name__ == "__main__":
    main(sys.argv[1])
