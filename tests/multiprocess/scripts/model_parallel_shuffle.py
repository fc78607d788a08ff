"""One process of a model-parallel job (pipeline K=2 or tensor T=2) fitting numpy arrays with
Keras's default ``shuffle=True`` and no seed anywhere (`tfdist.compat.shuffle`).

Every process builds the whole model from initializers with fixed seeds (no global seed is
set: the process reports it), takes its part with ``strategy.build_model`` and fits 2 epochs of
4 global batches, shuffled. The chief then trains the whole model in one process on the
permutation one process draws with ``tf.random.set_seed(seed)``, the seed the job agreed, and
reports its losses and weights; and a control, the same run unshuffled (its losses must differ,
or the shuffle would be untested). Last, the sabotage: a fit whose seed agreement is replaced by
a seed per process must be stopped at its first step by the batch check. First of all, before
``build_model``, a model made and fit outside every strategy's scope must be refused
(``unsplit_fit``); the chief's one-process runs, after ``build_model``, are accepted.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import tfdist
from tfdist.compat import shuffle
from tfdist.core import flavour
from tfdist.testing import report

GLOBAL, ROWS, EPOCHS, FEATURES = 8, 32, 2, 6


def build(keras):
    def dense(width, name, activation=None):
        return keras.layers.Dense(
            width, activation=activation, name=name,
            kernel_initializer=keras.initializers.GlorotUniform(seed=len(name) + width),
            bias_initializer=keras.initializers.RandomUniform(-0.1, 0.1, seed=width))

    inputs = keras.Input((FEATURES,))
    hidden = dense(8, "up", "tanh")(inputs)
    hidden = dense(6, "down", "tanh")(hidden)
    return keras.Model(inputs, dense(1, "head")(hidden))


def data():
    rng = np.random.default_rng(11)
    x = rng.normal(size=(ROWS, FEATURES)).astype("float32")
    y = (np.sin(x[:, :1] * 2) + x[:, 1:2] * x[:, 2:3]).astype("float32")
    return x, y


def one_process(keras, initial, x, y, seed, shuffled):
    model = build(keras)
    model.set_weights(initial)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    if shuffled:
        tf.random.set_seed(seed)
    try:
        history = model.fit(x, y, batch_size=GLOBAL, epochs=EPOCHS, shuffle=shuffled, verbose=0)
    finally:
        tf.random.set_seed(None)
    return history.history["loss"], model.get_weights()


def sabotage(model, x, y, strategy):
    """A fit whose processes each draw their own seed (the agreement broken): must fail."""
    agree = shuffle.agree_seed
    shuffle.agree_seed = lambda rank, size, call, timeout: 1000 + rank
    try:
        model.fit(x, y, batch_size=GLOBAL, epochs=1, verbose=0)
        return "TRAINED ON DIFFERENT PERMUTATIONS"
    except tf.errors.InvalidArgumentError as err:
        return str(err)[:3000]
    finally:
        shuffle.agree_seed = agree


def unsplit_fit(keras, x, y):
    """A model made, compiled and fit outside every strategy's scope before ``build_model``:
    each process would train its own whole model. Must be refused before training."""
    model = build(keras)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    try:
        model.fit(x, y, batch_size=GLOBAL, epochs=1, verbose=0)
        return "TRAINED UNSPLIT"
    except tfdist.StrategyConfigError as err:
        return str(err)


def main() -> None:
    keras = flavour.get_keras()
    strategy = tfdist.get_strategy("auto")
    refused = unsplit_fit(keras, *data())
    whole = build(keras)
    initial = [w.copy() for w in whole.get_weights()]
    model = strategy.build_model(whole)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x, y = data()
    seed_before = shuffle.global_seed()
    loss = model.fit(x, y, batch_size=GLOBAL, epochs=EPOCHS, verbose=0).history["loss"]
    result = {"flavour": flavour.flavour_of(model), "seed_before": seed_before,
              "seed_after": shuffle.global_seed(), "seed": shuffle.last_seed(), "loss": loss,
              "unsplit_fit": refused}
    if strategy.name == "pipeline":
        trained = strategy.gather_weights(model)
        if strategy.is_chief:
            result["trained"] = [w.tolist() for w in trained]
    if strategy.is_chief:
        ref_loss, ref_weights = one_process(keras, initial, x, y, result["seed"], True)
        control_loss, _ = one_process(keras, initial, x, y, None, False)
        result.update(reference_loss=ref_loss, control_loss=control_loss,
                      reference=[w.tolist() for w in ref_weights])
    result["sabotage"] = sabotage(model, x, y, strategy)
    report(result)


if __name__ == "__main__":
    main()
