"""One process of a pipeline job on a functional graph (`graph_models`), or, without TF_CONFIG,
all stages in this process on logical CPUs: trains with ``model.fit`` and reports the gathered
weights, the logged loss, and the same model trained in one process.

Args: cases ``model:stages:micro_batches:schedule[:flags]`` (3 steps each), reported as one
JSON object by case; ``interleaved`` takes its chunks from ``$TFDIST_PIPELINE_CHUNKS``. Flag
``sabotage`` zeroes the gradient of tensor 1 of each cut on its way back (in the residual model,
split inside a block, the block's input: the skip): the parity check must then fail; flag
``recompute`` runs each stage's forward again in its backward (``recompute=True``).
"""

from __future__ import annotations

import os
import sys

import tensorflow as tf

if not os.environ.get("TF_CONFIG"):
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 3)

import numpy as np  # noqa: E402
from graph_models import (  # noqa: E402
    GLOBAL,
    MODELS,
    compile_args,
    floatx_of,
    keras,
    layer_weights,
)

import tfdist  # noqa: E402
from tfdist.core import flavour  # noqa: E402
from tfdist.pipeline import local, transport  # noqa: E402
from tfdist.testing import report, task_name  # noqa: E402

CHIEFS = ("chief:0", "worker:0")


def sabotage_first_gradient(link_class):
    """The gradient a stage sends back as index 1 of a cut becomes zeros."""
    send = link_class.send

    def zero(self, tensor, kind, micro_batch=0, index=0, phase=transport.TRAIN):
        if kind == transport.GRADIENT and index == 1:
            tensor = tf.zeros_like(tensor)
        return send(self, tensor, kind, micro_batch, index, phase)

    link_class.send = zero


def fitted(model, x, y, loss, optimizer, prebuild=False):
    model.compile(**compile_args(loss, optimizer))
    if prebuild:  # the one-process reference: its optimizer's variables made now, not in the
        # first traced step, which tf.function would then trace twice (the same numbers)
        model.optimizer.build(model.trainable_variables)
    history = model.fit(x, y, batch_size=GLOBAL, epochs=1, shuffle=False, verbose=0)
    return history.history["loss"]


def reference(name, steps=3):
    """Model ``name`` trained whole in this process: its initial and trained weights, its logged
    loss."""
    with floatx_of(name):
        return _reference(name, steps)


def _reference(name, steps):
    build, data, loss, optimizer = MODELS[name]
    keras.utils.set_random_seed(1)
    whole = build()
    initial = [w.tolist() for w in layer_weights(whole)]
    ref_loss = fitted(whole, *data(steps), loss, optimizer, prebuild=True)
    return {"initial": initial, "reference": [w.tolist() for w in layer_weights(whole)],
            "reference_loss": ref_loss}


def run_case(case, steps=3):
    """Trains case ``model:stages:micro_batches:schedule[:flags]`` (flags: ``sabotage``,
    ``recompute``); returns its report."""
    with floatx_of(case.split(":")[0]):
        return _run_case(case, steps)


def _run_case(case, steps):
    name, stages, micro, schedule, *flags = case.split(":")
    build, data, loss, optimizer = MODELS[name]
    strategy = tfdist.get_strategy("pipeline", stages=int(stages), micro_batches=int(micro),
                                   schedule=schedule, recompute="recompute" in flags or None)
    keras.utils.set_random_seed(1)
    model = strategy.build_model(build())
    link_class = local.LocalLink if strategy.devices else transport.Link
    real_send = link_class.send
    if "sabotage" in flags:
        sabotage_first_gradient(link_class)
    x, y = data(steps)
    history = fitted(model, x, y, loss, optimizer)
    link_class.send = real_send
    trained = strategy.gather_weights(model)
    result = {"loss": history, "stage": strategy.stage_report(),
              "cuts": [list(c) for c in strategy.spec.cuts(strategy.bounds)],
              "flavour": flavour.flavour_of(model)}
    if strategy.is_chief:
        result["trained"] = [np.asarray(w).tolist() for w in trained]
    return result


def split_only(name):
    """keras.applications ``name`` (32x32 inputs, no weights) described, split in two at the
    balanced cut and both stages built: what the cut carries and what each stage holds."""
    from tfdist.pipeline import stage

    def build():
        return getattr(keras.applications, name)(input_shape=(32, 32, 3), weights=None,
                                                 classes=5)

    spec, bounds = stage.split_model(build, stages=2)
    parts = [stage.build_stage(spec, bounds, k) for k in range(2)]
    out = parts[1](parts[0]([np.zeros((2, 32, 32, 3), "float32")]))
    try:
        stage.split_model(build, stages=2, micro_batches=4)
        refused = None
    except tfdist.StrategyConfigError as err:
        refused = str(err)
    return {"nodes": len(spec.nodes), "bounds": list(bounds),
            "cut_shapes": [[list(spec.shapes[t]) for t in cut] for cut in spec.cuts(bounds)],
            "stage_bytes": [stage.weights_nbytes(p.weights) for p in parts],
            "model_bytes": spec.total_param_bytes, "output_shape": list(out.shape),
            "refused_m4": refused}


def main(cases):
    """Each case's report. The chief trains the references after every case: a process that
    starts its next case's collectives while a peer trains a reference can find its transfer
    dropped (TensorFlow aborts it: "Delete called on non-empty BufRendezvous")."""
    results = {case: split_only(case.split(":")[0]) if case.endswith(":split")
               else run_case(case) for case in cases}
    if task_name() in CHIEFS:
        names = {case.split(":")[0] for case in cases if not case.endswith(":split")}
        references = {name: reference(name) for name in names}
        for case, result in results.items():
            result.update(references.get(case.split(":")[0], {}))
    report(results)


if __name__ == "__main__":
    main(sys.argv[1:])
