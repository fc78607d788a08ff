"""One process of a pipeline job (D replicas x K stages): trains a deep MLP split into stages with
``model.fit`` and reports the reassembled weights, and the single-process reference.

Args: ``steps micro_batches schedule [--sabotage] [--save DIR] [--custom-loop]
[--sample-weight] [--regularize] [--adam] [--then-diverge] [--no-evaluate]``. Every process
builds the whole model once with a fixed seed (so the stages start from the reference's weights),
takes its stage with ``strategy.build_model(model)``, and fits ``steps`` global batches of
``GLOBAL`` rows (or runs ``strategy.train_step`` on them: ``--custom-loop``). The chief then
computes, in one process: the reference (the whole model fitted on the same global batches) and a
control that trains on the first half of each global batch only (a pipeline that lost
micro-batches or replicas would look like it). ``--sabotage`` zeroes every gradient sent back
between stages: the parity check must then fail. ``--sample-weight`` fits ``(x, y,
sample_weight)`` (the reference and the control too). ``--regularize`` gives the layers L2
kernel regularizers (every layer), an L1 bias regularizer and L2 activity regularizers (early
and last layer), in the reference too. ``--adam`` trains with Adam instead of SGD (everywhere).
``--no-evaluate``: no ``evaluate`` and ``predict`` (nor the reference's), for tests that do not
check them: their traced functions are most of a short job's CPU.

First of all, every process builds its stage from a build function that seeds
(``keras.utils.set_random_seed(INITIAL_SEED)`` inside it, a Dropout before the last layer moving
the stream) and the chief reports ``initial_gap``: the largest gap between the stages' weights,
gathered right after ``build_model``, and the same function's model built in one process.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import tfdist
from tfdist.core import flavour
from tfdist.testing import report

GLOBAL, FEATURES, LR, ADAM_LR = 24, 5, 0.1, 0.02
REGULARIZATION = 0.05


def regularizers(keras, name):
    """Layer ``name``'s regularizers with ``--regularize``: an L2 kernel term on every layer, an
    L1 bias term on d2, L2 activity terms on d1 (stage 0 of two) and on the output."""
    rate = REGULARIZATION
    found = {"kernel_regularizer": keras.regularizers.L2(rate)}
    if name == "d2":
        found["bias_regularizer"] = keras.regularizers.L1(rate)
    if name in ("d1", "out"):
        found["activity_regularizer"] = keras.regularizers.L2(rate)
    return found


def build(keras, regularize=False, dropout=False):
    def extra(name):
        return regularizers(keras, name) if regularize else {}

    layers = [keras.Input((FEATURES,))]
    for i, width in enumerate((8, 8, 6, 6, 4)):
        layers.append(keras.layers.Dense(width, activation="tanh", name=f"d{i}",
                                         **extra(f"d{i}")))
    if dropout:
        layers.append(keras.layers.Dropout(0.1, name="drop"))
    layers.append(keras.layers.Dense(1, name="out", **extra("out")))
    return keras.Sequential(layers, name="deep_mlp")


INITIAL_SEED = 5


def seeded_build(keras, regularize=False):
    """The whole model as a user's build function makes it: seeded inside, with a Dropout (no
    weights; its seed generator takes a seed from the stream all the same)."""
    keras.utils.set_random_seed(INITIAL_SEED)
    return build(keras, regularize, dropout=True)


def initial_gap(strategy, keras, regularize):
    """Builds this process's stage from `seeded_build` and gathers the weights (a collective);
    on the chief, their largest gap to one process's `seeded_build`, else None."""
    drawn = strategy.gather_weights(strategy.build_model(lambda: seeded_build(keras, regularize)))
    if not strategy.is_chief:
        return None
    one = seeded_build(keras, regularize).get_weights()
    return max(float(np.max(np.abs(np.asarray(a) - b))) for a, b in zip(drawn, one, strict=True))


def data(steps):
    rng = np.random.default_rng(7)
    x = rng.normal(size=(steps * GLOBAL, FEATURES)).astype("float32")
    y = (np.sin(x[:, :1] * 2) + x[:, 1:2] * x[:, 2:3]).astype("float32")
    return x, y


def sabotage_gradient_sends(link_class=None):
    """Every gradient a stage sends back through ``link_class`` (default: the processes'
    `transport.Link`) becomes zeros (the mechanism under test, broken). Returns the real send."""
    import tensorflow as tf

    from tfdist.pipeline import transport

    link_class = link_class or transport.Link
    send = link_class.send

    def zero_gradients(self, tensor, kind, *args, **kwargs):
        if kind == transport.GRADIENT:
            tensor = tf.zeros_like(tensor)
        return send(self, tensor, kind, *args, **kwargs)

    link_class.send = zero_gradients
    return send


def optimizer(keras, adam=False):
    return keras.optimizers.Adam(ADAM_LR) if adam else keras.optimizers.SGD(LR)


def fitted(keras, initial, x, y, batch, weight=None, regularize=False, adam=False):
    model = build(keras, regularize)
    model.set_weights(initial)
    model.compile(optimizer=optimizer(keras, adam), loss="mse")
    # the optimizer's variables made now, not in the first traced step, which tf.function would
    # then trace twice (0.3-1 CPU-s a fit): the same numbers, measured gap 0
    model.optimizer.build(model.trainable_variables)
    history = model.fit(x, y, sample_weight=weight, batch_size=batch, epochs=1, shuffle=False,
                        verbose=0)
    return model, history


def diverge_replica(strategy, model, x, y):
    """The sabotage of ``--then-diverge``: replica 1 moves its first weight (each stage's) by
    1e-3, then the job fits one more step. With ``TFDIST_CHECK_WEIGHTS_EVERY=1`` the replicated
    weights' check must stop that step on every process, naming replica 1's ranks."""
    import tensorflow as tf

    if strategy.stage_report()["replica"] == 1:
        variable = model.trainable_variables[0]
        variable.assign(variable + 1e-3)
    try:
        model.fit(x[:GLOBAL], y[:GLOBAL], batch_size=GLOBAL, epochs=1, shuffle=False, verbose=0)
        return "TRAINED WITH DIVERGED REPLICAS"
    except tf.errors.InvalidArgumentError as err:
        return str(err)[:3000]


def main(argv):
    steps, micro_batches, schedule = int(argv[0]), int(argv[1]), argv[2]
    if "--sabotage" in argv:
        sabotage_gradient_sends()
    keras = flavour.get_keras()
    strategy = tfdist.get_strategy("auto", micro_batches=micro_batches, schedule=schedule)
    regularize, adam = "--regularize" in argv, "--adam" in argv
    first_gap = initial_gap(strategy, keras, regularize)
    keras.utils.set_random_seed(1)
    whole = build(keras, regularize)
    initial = [w.copy() for w in whole.get_weights()]
    model = strategy.build_model(whole)
    del whole
    model.compile(optimizer=optimizer(keras, adam), loss="mse")
    x, y = data(steps)
    weight = None
    if "--sample-weight" in argv:
        weight = np.random.default_rng(3).uniform(0.0, 2.0, size=len(x)).astype("float32")
    if "--custom-loop" in argv:  # strategy.train_step instead of fit; the mean loss per epoch
        step = strategy.train_step(model, "mse", optimizer(keras, adam))
        losses = [float(step(x[i:i + GLOBAL], y[i:i + GLOBAL])) for i in range(0, len(x), GLOBAL)]
        loss = [float(np.mean(losses))]
    else:
        loss = model.fit(x, y, sample_weight=weight, batch_size=GLOBAL, epochs=1,
                         shuffle=False, verbose=0).history["loss"]
    result = {
        "strategy": strategy.name, "stage": strategy.stage_report(), "initial_gap": first_gap,
        "loss": loss, "flavour": flavour.flavour_of(model),
        "replicas": strategy.num_replicas, "own_weights": len(model.get_weights()),
    }
    evaluate = "--no-evaluate" not in argv
    if evaluate:
        result.update(evaluate=model.evaluate(x, y, batch_size=GLOBAL, verbose=0),
                      predict=model.predict(x[:GLOBAL], batch_size=GLOBAL, verbose=0).tolist())
    save_dir = argv[argv.index("--save") + 1] if "--save" in argv else None
    if save_dir:
        result["saved"] = strategy.save_model(model, os.path.join(save_dir, "model.keras"))
    trained = strategy.gather_weights(model)
    if "--then-diverge" in argv:  # before the chief's references: no collective left waiting
        result["diverged"] = diverge_replica(strategy, model, x, y)
    if strategy.is_chief:
        reference, ref_history = fitted(keras, initial, x, y, GLOBAL, weight, regularize, adam)
        part = GLOBAL // 2
        keep = (np.arange(len(x)) % GLOBAL) < part
        control, _ = fitted(keras, initial, x[keep], y[keep], part,
                            None if weight is None else weight[keep], regularize, adam)
        result.update(
            trained=[w.tolist() for w in trained], initial=[w.tolist() for w in initial],
            reference=[w.tolist() for w in reference.get_weights()],
            control=[w.tolist() for w in control.get_weights()],
            reference_loss=ref_history.history["loss"])
        if evaluate:
            result.update(
                reference_evaluate=reference.evaluate(x, y, batch_size=GLOBAL, verbose=0),
                reference_predict=reference.predict(x[:GLOBAL], batch_size=GLOBAL,
                                                    verbose=0).tolist())
        if save_dir:
            loaded = keras.models.load_model(os.path.join(save_dir, "model.keras"))
            result["reloaded"] = [w.tolist() for w in loaded.get_weights()]
            result["reloaded_layers"] = [layer.name for layer in loaded.layers]
    report(result)


if __name__ == "__main__":
    main(sys.argv[1:])
