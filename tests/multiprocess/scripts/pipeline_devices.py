"""All pipeline stages in one process, on logical CPUs: trains the deep MLP of
``pipeline_parity.py`` with ``model.fit`` for each case and reports, per case, the weights, the
one-process reference, where each stage's variables live, and the losses.

Args: ``save_dir case [case ...]``, each
``stages:micro_batches:schedule[:weighted][:sabotage][:regularize][:drop]``. ``weighted`` fits
``(x, y, sample_weight)``; ``sabotage`` zeroes every gradient a stage hands back (the parity
check must then fail); ``regularize`` adds ``pipeline_parity``'s regularizers; ``drop`` drops
stage 1's regularization losses (the parity check must then fail); ``scoped`` compiles inside
``strategy.scope()``. Each case's trained model
is saved in ``save_dir`` and loaded back; then the stages are built inside
``strategy.scope()``, which must be refused. Reports one JSON object (``tfdist.testing.report``).
"""

from __future__ import annotations

import contextlib
import os
import sys

import tensorflow as tf

LOGICAL_CPUS = 3
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * LOGICAL_CPUS)

import numpy as np  # noqa: E402
from pipeline_parity import GLOBAL, LR, build, data, sabotage_gradient_sends  # noqa: E402

import tfdist  # noqa: E402
from tfdist.compat import models as keras_compat  # noqa: E402
from tfdist.core import flavour  # noqa: E402
from tfdist.pipeline import local  # noqa: E402
from tfdist.testing import report  # noqa: E402

STEPS = 3


def sample_weights(rows):
    return np.random.default_rng(3).uniform(0.0, 2.0, size=rows).astype("float32")


def drop_stage1_regularization():
    """Stage 1 loses its regularization losses (weights and activity); returns the undo."""
    saved = keras_compat.weight_losses, keras_compat.call_losses

    def dropping(original):
        return lambda model: [] if model.name.endswith("_stage1") else original(model)

    keras_compat.weight_losses, keras_compat.call_losses = (dropping(f) for f in saved)

    def restore():
        keras_compat.weight_losses, keras_compat.call_losses = saved

    return restore


def device(variable):
    return getattr(variable, "device", None) or variable.value.device


def fit(keras, model, x, y, weight, scope=None):
    with scope or contextlib.nullcontext():  # the README's scripts compile in strategy.scope()
        model.compile(optimizer=keras.optimizers.SGD(LR, momentum=0.5), loss="mse",
                      metrics=["mae"], weighted_metrics=["mae"])
    history = model.fit(x, y, sample_weight=weight, batch_size=GLOBAL, epochs=1, shuffle=False,
                        verbose=0)
    return history.history


def run_case(keras, save_dir, case):
    stages, micro, schedule, *flags = case.split(":")
    strategy = tfdist.get_strategy("pipeline", stages=int(stages), micro_batches=int(micro),
                                   schedule=schedule)
    regularize = "regularize" in flags
    keras.utils.set_random_seed(1)
    whole = build(keras, regularize)
    initial = [w.copy() for w in whole.get_weights()]
    model = strategy.build_model(whole)
    x, y = data(STEPS)
    weight = sample_weights(len(x)) if "weighted" in flags else None
    restore = sabotage_gradient_sends(local.LocalLink) if "sabotage" in flags else None
    undo = drop_stage1_regularization() if "drop" in flags else None
    history = fit(keras, model, x, y, weight, strategy.scope() if "scoped" in flags else None)
    if restore is not None:
        local.LocalLink.send = restore
    if undo is not None:
        undo()
    reference = build(keras, regularize)
    reference.set_weights(initial)
    ref_history = fit(keras, reference, x, y, weight)
    saved = strategy.save_model(model, os.path.join(save_dir, case.replace(":", "_") + ".keras"))
    return {
        "evaluate": model.evaluate(x, y, batch_size=GLOBAL, verbose=0, return_dict=True),
        "reference_evaluate": reference.evaluate(x, y, batch_size=GLOBAL, verbose=0,
                                                 return_dict=True),
        "reloaded": [w.tolist() for w in keras.models.load_model(saved).get_weights()],
        "describe": strategy.describe(), "history": history, "reference_history": ref_history,
        "trained": [w.tolist() for w in strategy.gather_weights(model)],
        "reference": [w.tolist() for w in reference.get_weights()],
        "initial": [w.tolist() for w in initial],
        "variable_devices": [sorted({device(v) for v in stage.weights})
                             for stage in model.pipeline_stages],
        "slot_devices": sorted(device(v) for v in model.optimizer.variables if len(v.shape)),
        "predict": model.predict(x[:GLOBAL], batch_size=GLOBAL, verbose=0).tolist(),
        "reference_predict": reference.predict(x[:GLOBAL], batch_size=GLOBAL,
                                               verbose=0).tolist(),
        "layers": strategy.stage_report()["layers"],
    }


def error_in_scope(keras):
    """The error of building the stages inside the strategy's scope (one device for all)."""
    strategy = tfdist.get_strategy("pipeline", stages=2, micro_batches=2)
    try:
        with strategy.scope():
            strategy.build_model(lambda: build(keras))
    except tfdist.StrategyConfigError as err:
        return str(err)
    return None


def main(save_dir, *cases):
    keras = flavour.get_keras()
    report({"flavour": flavour.keras_flavour(),
            "cases": {case: run_case(keras, save_dir, case) for case in cases},
            "error_in_scope": error_in_scope(keras)})


if __name__ == "__main__":
    main(*sys.argv[1:])
