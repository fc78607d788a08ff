"""Peak resident memory of training: one process of a K-stage pipeline (its stage built from a
build function), or with ``--single`` one process training the whole model (the reference).

Args: ``micro_batches schedule [--single] [--arithmetic] [--activations] [--recompute]``
(``--arithmetic``: keep Grappler's arithmetic optimizer on, as before the fix;
``--activations``: a model whose activations dominate its memory; ``--recompute``: activation
recomputation). The model is an MLP of ``LAYERS``
square ``WIDTH`` layers (about 50 MB of float32 weights), trained with Adam for ``STEPS`` steps.
A thread samples this process's resident memory every millisecond during ``fit``; the report
gives the peak's growth above the memory before ``fit`` (what training adds: gradients,
optimizer slots, activations, and whatever the schedule keeps), with the weights' bytes.

Run it under `tfdist.bench.memory.MALLOC_ENV` (resident memory then follows allocation).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from tfdist.bench.memory import PeakSampler, rss_bytes
from tfdist.core import flavour
from tfdist.testing import report

WIDTH, LAYERS, FEATURES, GLOBAL, STEPS = 1536, 6, 16, 64, 3
ACTIVATIONS = {"width": 256, "rows": 8192}
"""``--activations``: narrow layers, a big batch (activations dominate: 8 MB per layer output)."""


def build(keras, width=WIDTH):
    layers = [keras.Input((FEATURES,)), keras.layers.Dense(width, activation="relu", name="in")]
    for i in range(LAYERS):
        layers.append(keras.layers.Dense(width, activation="relu", name=f"h{i}"))
    layers.append(keras.layers.Dense(1, name="out"))
    return keras.Sequential(layers, name="wide_mlp")


def main(argv):
    keras = flavour.get_keras()
    micro_batches, schedule = int(argv[0]), argv[1]
    width, rows = WIDTH, GLOBAL
    if "--activations" in argv:
        width, rows = ACTIVATIONS["width"], ACTIVATIONS["rows"]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows * STEPS, FEATURES)).astype("float32")
    y = x[:, :1] * 2
    if "--single" in argv:
        model, strategy = build(keras, width), None
    else:
        import tfdist

        strategy = tfdist.get_strategy("auto", micro_batches=micro_batches, schedule=schedule,
                                       arithmetic_optimization="--arithmetic" in argv,
                                       recompute="--recompute" in argv)
        model = strategy.build_model(lambda: build(keras, width))
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")
    import gc

    gc.collect()
    before = rss_bytes()
    start = time.perf_counter()
    with PeakSampler() as sampler:
        history = model.fit(x, y, batch_size=rows, epochs=1, shuffle=False, verbose=0)
    seconds = time.perf_counter() - start
    weight_bytes = sum(int(np.prod(w.shape)) * 4 for w in model.weights)
    report({
        "stage": None if strategy is None else strategy.stage_report()["stage"],
        "weight_bytes": weight_bytes, "before": before, "peak": sampler.peak,
        "growth": sampler.peak - before, "loss": history.history["loss"], "seconds": seconds,
    })


if __name__ == "__main__":
    main(sys.argv[1:])
