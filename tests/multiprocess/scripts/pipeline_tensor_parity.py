"""One process of a pipeline whose stages are split by tensor parallelism (D x K x T): trains
`tensor_parity`'s small Transformer LM cut into 2 stages between its blocks, each stage split T
ways, with Adam and ``model.fit``, and reports what the test checks.

Args: ``steps micro_batches [--sabotage] [--custom-loop] [--save DIR] [--then-custom-loop]
[--then-sabotage] [--no-reference]``. Every process first
builds its stage's shard from the build function (the bytes it holds, and a digest of the
weights every shard of its stage holds whole), then builds the whole model once with a fixed
seed and takes its slices of its stage's layers, fits ``steps`` global batches, evaluates and
predicts, and reports the gathered weights (on the chief). The chief also trains the whole model
in one process on the same global batches (the reference). ``--sabotage`` makes the row-split
layers skip their all-reduce. ``--then-custom-loop`` and ``--then-sabotage`` run more phases in
the same job, each on a fresh stage shard from the same initial weights, reported under
``phases`` (one launch checked three ways; the reference is the same). ``--no-reference``: the
chief leaves the reference out (the test takes it from another job that trained the same model on
the same batches). Its first build's function seeds inside (`tensor_parity.seeded_build`); the
chief reports ``initial_gap``, the largest gap between the stages' shards gathered right after
``build_model`` and that function's model built in one process."""

from __future__ import annotations

import os
import sys

import keras
import numpy as np
from tensor_parity import (
    GLOBAL,
    LR,
    build,
    data,
    digest,
    later_phases,
    loss,
    sabotage_row_reduce,
    seeded_build,
)

import tfdist
from tfdist.testing import exit_after_report, report

SPLIT_POINTS = ["b1_ln1"]
"""Stage 0: embeddings and block 0; stage 1: block 1 and the head."""


def replicated_digest(strategy, model):
    """A digest of the weights every shard of this stage holds whole."""
    names = {layer.name for layer in model.layers}
    values = [v.numpy() for layer in strategy.plan.layers if layer.name in names
              for v, w in zip(model.get_layer(layer.name).weights, layer.weights, strict=True)
              if w.axis is None]
    return digest(values)


def train(strategy, model, x, y, custom_loop, evaluate=True):
    """Trains ``model`` one epoch on the global batches with Adam; its logged loss (and under
    ``fit``, with ``evaluate``, evaluate and predict)."""
    optimizer = keras.optimizers.Adam(LR)
    if custom_loop:
        step = strategy.train_step(model, loss(), optimizer)
        losses = [float(step(x[i:i + GLOBAL], y[i:i + GLOBAL])) for i in range(0, len(x), GLOBAL)]
        return {"loss": [float(np.mean(losses))]}
    model.compile(optimizer=optimizer, loss=loss())
    history = model.fit(x, y, batch_size=GLOBAL, epochs=1, shuffle=False, verbose=0)
    if not evaluate:
        return {"loss": history.history["loss"]}
    return {"loss": history.history["loss"],
            "evaluate": model.evaluate(x, y, batch_size=GLOBAL, verbose=0),
            "predict": model.predict(x[:GLOBAL], batch_size=GLOBAL, verbose=0).tolist()}


def reference_results(initial, names, x, y):
    """The whole model trained in one process from ``initial`` on the same global batches."""
    reference = build()
    reference.set_weights(initial)
    reference.compile(optimizer=keras.optimizers.Adam(LR), loss=loss())
    # Adam's slots made now, not in the first traced step, which tf.function would then
    # trace twice (2.3 of this fit's 4.3 CPU-s): the same numbers
    reference.optimizer.build(reference.trainable_variables)
    history = reference.fit(x, y, batch_size=GLOBAL, epochs=1, shuffle=False, verbose=0)
    return dict(
        reference=[w.tolist() for name in names for w in reference.get_layer(name).get_weights()],
        reference_loss=history.history["loss"],
        reference_evaluate=reference.evaluate(x, y, batch_size=GLOBAL, verbose=0),
        reference_predict=reference.predict(x[:GLOBAL], batch_size=GLOBAL, verbose=0).tolist())


def main(argv):
    steps, micro_batches = int(argv[0]), int(argv[1])
    if "--sabotage" in argv:
        sabotage_row_reduce()
    strategy = tfdist.get_strategy("auto", micro_batches=micro_batches,
                                   split_points=SPLIT_POINTS)
    from_fn = strategy.build_model(seeded_build)
    drawn = strategy.gather_weights(from_fn)  # the stages' shards, on the chief
    place = strategy.layout.coordinates
    result = {"strategy": strategy.name, "shards": strategy.shards, "stage": place.pipe,
              "shard": place.tensor, "replica": place.data, "plan": strategy.plan.as_dict(),
              "fn_bytes": int(sum(v.numpy().nbytes for v in from_fn.weights)),
              "replicated_digest": replicated_digest(strategy, from_fn),
              "report_bytes": strategy.stage_report()["param_bytes"]}
    if strategy.is_chief:
        one = seeded_build().get_weights()
        result["initial_gap"] = max(float(np.max(np.abs(np.asarray(a) - b)))
                                    for a, b in zip(drawn, one, strict=True))
    del from_fn, drawn
    keras.utils.set_random_seed(1)
    whole = build()
    names = [layer.name for layer in whole.layers if layer.weights]
    initial = [w.copy() for w in whole.get_weights()]
    model = strategy.build_model(whole)
    x, y = data(steps)
    result.update(train(strategy, model, x, y, custom_loop="--custom-loop" in argv))
    result["held_bytes"] = int(sum(v.numpy().nbytes for v in model.weights))
    trained = strategy.gather_weights(model)
    result["phases"] = later_phases(
        strategy, whole, argv,
        lambda shard, **how: train(strategy, shard, x, y, **how),
        strategy.gather_weights)
    save_dir = argv[argv.index("--save") + 1] if "--save" in argv else None
    if save_dir:
        result["saved"] = strategy.save_model(model, os.path.join(save_dir, "model.keras"))
    if strategy.is_chief:
        result.update(trained=[np.asarray(w).tolist() for w in trained],
                      initial=[w.tolist() for w in initial])
        if "--no-reference" not in argv:
            result.update(reference_results(initial, names, x, y))
        if save_dir:
            loaded = keras.models.load_model(os.path.join(save_dir, "model.keras"))
            result["reloaded"] = [w.tolist() for name in names
                                  for w in loaded.get_layer(name).get_weights()]
    report(result)


if __name__ == "__main__":
    main(sys.argv[1:])
    exit_after_report()
