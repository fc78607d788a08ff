"""One process of a 2-stage pipeline job that trains an Embedding model with one optimizer per
case, and reports, per case, the gap between the reassembled weights and one process training
the whole model on the same global batches (the chief computes the reference), or the refusal.

Args: ``steps micro_batches schedule case [case ...]``. A case is an optimizer name and its
options, ``adam``, ``adam:clipnorm=0.05``, ``adam:weight_decay=0.1:exclude=out``,
``adam:loss_scale=1``... (see `make_optimizer`); ``local_norm=1`` breaks the mechanism under
test for that case (each stage clips by its own gradients' norm: the sabotage of
``global_clipnorm``); ``w_drop=1`` breaks the zero-bubble schedule's W (a stage's deferred W
drop their gradients). Stage 0 is the embedding (its gradient an ``IndexedSlices`` with repeated
rows: a small vocabulary), stage 1 the dense layers.

With ``--recompute`` the stages recompute their activations in the backward. With
``--dense-control`` the chief also trains the reference with the embedding's gradient
densified (what the pipeline did before): it must differ from the reference, or the cases could
not tell a sparse-exact pipeline from a densifying one.
"""

from __future__ import annotations

import sys

import numpy as np

import tfdist
from tfdist.core import flavour
from tfdist.errors import StrategyConfigError
from tfdist.testing import report

GLOBAL, SEQ, VOCAB, DIM, LR = 16, 6, 7, 4, 0.05


def build(keras):
    return keras.Sequential([
        keras.Input((SEQ,), dtype="int32"),
        keras.layers.Embedding(VOCAB, DIM, name="emb"),
        keras.layers.Flatten(name="flat"),
        keras.layers.Dense(8, activation="tanh", name="d0"),
        keras.layers.Dense(1, name="out"),
    ], name="embedding_mlp")


def data(steps):
    rng = np.random.default_rng(5)
    x = rng.integers(0, VOCAB, size=(steps * GLOBAL, SEQ)).astype("int32")
    y = (np.sin(x[:, :1]) + 0.1 * x[:, 1:2]).astype("float32")
    return x, y


def make_optimizer(keras, case):
    """``name:option=value:...``: options passed to the optimizer, but ``exclude=a,b`` (weight
    decay exclusions by variable name) and ``loss_scale=1`` (wrap in a LossScaleOptimizer)."""
    name, *options = case.split(":")
    kwargs, exclude, loss_scale = {}, None, False
    for option in options:
        key, value = option.split("=")
        if key == "exclude":
            exclude = value.split(",")
        elif key == "loss_scale":
            loss_scale = True
        elif key in ("local_norm", "w_drop"):
            continue
        else:
            kwargs[key] = value in ("1", "true") if key == "use_ema" else (
                int(value) if key == "gradient_accumulation_steps" else float(value))
    optimizer = {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD,
                 "adamw": keras.optimizers.AdamW}[name](LR, **kwargs)
    if exclude:
        optimizer.exclude_from_weight_decay(var_names=exclude)
    if loss_scale:
        optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


def fit_reference(keras, initial, x, y, case, densify=False):
    model = build(keras)
    model.set_weights(initial)
    optimizer = make_optimizer(keras, case)
    if densify:  # the embedding's gradient handed over dense: what the pipeline did before
        import tensorflow as tf

        apply = optimizer.apply_gradients
        optimizer.apply_gradients = lambda pairs, *a, **k: apply(
            [(tf.convert_to_tensor(g), v) for g, v in pairs], *a, **k)
    model.compile(optimizer=optimizer, loss="mse")
    # the optimizer's variables made now, not in the first traced step, which tf.function would
    # then trace twice (0.3-1 CPU-s a fit): the same numbers, measured gap 0
    model.optimizer.build(model.trainable_variables)
    history = model.fit(x, y, batch_size=GLOBAL, epochs=1, shuffle=False, verbose=0)
    return [w.tolist() for w in model.get_weights()], history.history["loss"]


def stage_local_norm():
    """Each stage's own gradients' norm instead of the whole model's (the sabotage)."""
    import tensorflow as tf

    from tfdist.pipeline import optimizers

    optimizers.global_norm_across_stages = lambda grads, engine: tf.sqrt(
        optimizers._squared_sum(grads))


def weight_pass_dropped_when_deferred():
    """A split backward's W that drops the weight gradients of a micro-batch whose W a stage
    defers to the end of the step (the sabotage of the zero-bubble schedule's W)."""
    import tensorflow as tf

    from tfdist.pipeline import engine

    real = engine.OP_HANDLERS["W"]

    def broken(stage_engine, step, m):
        if m < stage_engine.layout.stage:  # stage k defers its first k W
            step.deferred.pop(m)
            return tf.no_op()
        return real(stage_engine, step, m)

    engine.OP_HANDLERS["W"] = broken


def run_case(keras, strategy, initial, x, y, case):
    if "local_norm=1" in case:
        stage_local_norm()
    if "w_drop=1" in case:
        weight_pass_dropped_when_deferred()
    whole = build(keras)
    whole.set_weights(initial)
    model = strategy.build_model(whole)
    try:
        model.compile(optimizer=make_optimizer(keras, case), loss="mse")
    except StrategyConfigError as err:
        return {"refused": str(err)}
    loss = model.fit(x, y, batch_size=GLOBAL, epochs=1, shuffle=False, verbose=0).history["loss"]
    return {"trained": strategy.gather_weights(model), "loss": loss}


def main(argv):
    steps, micro_batches, schedule = int(argv[0]), int(argv[1]), argv[2]
    cases = [a for a in argv[3:] if not a.startswith("--")]
    keras = flavour.get_keras()
    strategy = tfdist.get_strategy("auto", micro_batches=micro_batches, schedule=schedule,
                                   split_points=["d0"], recompute="--recompute" in argv)
    keras.utils.set_random_seed(1)
    initial = [w.copy() for w in build(keras).get_weights()]
    x, y = data(steps)
    results = {}
    for case in cases:
        result = run_case(keras, strategy, initial, x, y, case)
        if strategy.is_chief and "trained" in result:
            reference, ref_loss = fit_reference(keras, initial, x, y, case)
            trained = result.pop("trained")
            result["gap"] = max(float(np.max(np.abs(np.subtract(a, b))))
                                for a, b in zip(trained, reference, strict=True))
            result["moved"] = max(float(np.max(np.abs(np.subtract(a, b))))
                                  for a, b in zip(trained, initial, strict=True))
            result["loss_gap"] = float(np.max(np.abs(np.subtract(result["loss"], ref_loss))))
        results[case] = result
    out = {"flavour": flavour.flavour_of(build(keras)), "cases": results}
    if strategy.is_chief and "--dense-control" in argv:
        reference, _ = fit_reference(keras, initial, x, y, cases[0])
        dense, _ = fit_reference(keras, initial, x, y, cases[0], densify=True)
        out["dense_gap"] = max(float(np.max(np.abs(np.subtract(a, b))))
                               for a, b in zip(dense, reference, strict=True))
    report(out)


if __name__ == "__main__":
    main(sys.argv[1:])
