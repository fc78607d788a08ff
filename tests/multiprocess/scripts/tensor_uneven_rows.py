"""One process of a tensor job of 2 data replicas (D=2 x T=1) that fits a tiny model on global
batches of 9 rows (2 steps) where only the 9th row of each batch has a sample weight: the row
D=2 replicas cannot split evenly. The chief also fits the same model in one process on the same
batches and reports both logged losses and the largest weight gap. ``backup_layout.py`` runs
it in its second launch (the same mesh), so that job checks both.
"""

from __future__ import annotations

import keras
import numpy as np

import tfdist
from tfdist.testing import report


def build() -> keras.Model:
    keras.utils.set_random_seed(3)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, activation="tanh", name="up")(inputs)
    return keras.Model(inputs, keras.layers.Dense(1, name="head")(hidden))


def fit(model: keras.Model, x: np.ndarray, y: np.ndarray, weights: np.ndarray) -> list[float]:
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    history = model.fit(x, y, sample_weight=weights, batch_size=9, epochs=1, shuffle=False,
                        verbose=0)
    return history.history["loss"]


def uneven_rows(strategy: object) -> dict:
    """This process's result: its logged loss and trained ``up`` weights (the chief: also the
    one-process reference's loss and the largest weight gap to it)."""
    model = strategy.build_model(build())
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(18, 4)).astype("float32"), rng.normal(size=(18, 1)).astype("float32")
    weights = np.tile(np.eye(9, dtype="float32")[8], 2)  # the 9th row of each batch only
    result = {"loss": fit(model, x, y, weights),
              "trained": [np.asarray(w).tolist() for w in strategy.gather_weights(model)["up"]]}
    if strategy.is_chief:
        reference = build()
        result["reference_loss"] = fit(reference, x, y, weights)
        result["gap"] = max(float(np.max(np.abs(a - b))) for a, b in zip(
            model.get_weights(), reference.get_weights(), strict=True))
    return result


def main() -> None:
    report(uneven_rows(tfdist.get_strategy("auto")))


if __name__ == "__main__":
    main()
