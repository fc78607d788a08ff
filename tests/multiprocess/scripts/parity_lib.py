"""Shared pieces of the replica-parity scripts: data, model, single-process reference.

The data has ``steps`` global batches of ``2 * per_replica`` rows. Row ``r`` belongs to global
batch ``r // (2 * per_replica)``; both the distributed run and the reference see exactly these
global batches, in this order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

FEATURES = 3
LEARNING_RATE = 0.1


def make_data(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` float32 rows of a noisy linear target (different rows: different gradients)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES)).astype("float32")
    w = np.array([[1.5], [-2.0], [0.5]], dtype="float32")
    y = (x @ w + 0.3 * rng.normal(size=(rows, 1))).astype("float32")
    return x, y


def build_model(keras: Any) -> Any:
    """A tiny MLP, compiled with plain SGD and a mean-reduced MSE."""
    model = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE), loss="mse")
    return model


def reference_weights(
    keras: Any, initial: list[np.ndarray], x: np.ndarray, y: np.ndarray, global_batch: int
) -> list[np.ndarray]:
    """Weights after one pass of plain SGD over ``x`` in batches of ``global_batch``, in order."""
    model = build_model(keras)
    model.set_weights(initial)
    model.fit(x, y, batch_size=global_batch, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


def half_batch_weights(
    keras: Any, initial: list[np.ndarray], x: np.ndarray, y: np.ndarray, per_replica: int
) -> list[np.ndarray]:
    """Control: weights if only the first replica's half of each global batch had counted."""
    keep = (np.arange(len(x)) // per_replica) % 2 == 0
    return reference_weights(keras, initial, x[keep], y[keep], per_replica)


def as_lists(weights: list[Any]) -> list[list[Any]]:
    return [np.asarray(w).tolist() for w in weights]
