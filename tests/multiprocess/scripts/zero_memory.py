"""Resident memory of one process of a D=2 job training an MLP with Adam: replicated
(``multi_worker``, stage 0) or ZeRO stage 1, 2 or 3, phase by phase.

Args: ``stage width layers steps``. The model: ``Dense(width)`` from 16 features, ``layers``
square ``Dense(width)`` layers, ``Dense(1)`` (seeded; Adam, mean squared error, global batch
64: each process trains on its 32 rows). Each phase reports this process's resident memory after
it (``rss``) and its peak during it (``peak``), both above the memory before the model
(TensorFlow imported, the strategy made): ``build``, ``compile``, ``first`` (the first step:
tracing), ``steady`` (``steps`` more). The report's ``peak`` is the highest of them, besides
the bytes of the variables held after the steps (trainable weights with values, ZeRO's pieces,
optimizer slots), the largest layer's weights, and the last loss.

Run it under `tfdist.bench.memory.MALLOC_ENV` and ``TF_ENABLE_ONEDNN_OPTS=0`` (resident memory
then follows what TensorFlow allocates).
"""

from __future__ import annotations

import gc
import sys

import numpy as np
from memory_phases import FEATURES, build  # the pipeline memory test's MLP

from tfdist.bench.memory import PeakSampler, rss_bytes
from tfdist.testing import report

GLOBAL = 64


def main():
    stage, width, layers, steps = (int(a) for a in sys.argv[1:5])
    import keras

    import tfdist

    strategy = tfdist.get_strategy("multi_worker", **({"zero": stage} if stage else {}))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(GLOBAL * (steps + 1), FEATURES)).astype("float32")
    y = rng.normal(size=(GLOBAL * (steps + 1), 1)).astype("float32")
    # every process is given the same global batches: ZeRO takes its rows of each, and
    # multi_worker's Keras fit shards numpy input itself (cutting the rows first as well
    # trained on half of them: its loss was 1.346 against ZeRO's 1.200 at width 32)
    batch = GLOBAL
    gc.collect()
    base, rows = rss_bytes(), {}

    def phase(name, fn):
        with PeakSampler() as sampler:
            value = fn()
        gc.collect()
        rows[name] = {"rss": rss_bytes() - base, "peak": sampler.peak - base}
        return value

    def whole():
        if stage:
            return strategy.build_model(lambda: build(keras, width, layers))
        with strategy.scope():
            return build(keras, width, layers)

    model = phase("build", whole)

    def compile_():
        with strategy.scope():
            model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")

    phase("compile", compile_)

    def fit(start, stop):
        return model.fit(x[start * batch:stop * batch], y[start * batch:stop * batch],
                         batch_size=batch, epochs=1, verbose=0, shuffle=False)

    phase("first", lambda: fit(0, 1))
    history = phase("steady", lambda: fit(1, steps + 1))
    engine = getattr(model, "zero_engine", None)
    if engine is not None:
        held = engine.held_bytes()
    else:
        held = {"weights": sum(int(v.numpy().nbytes) for v in model.trainable_weights),
                "pieces": 0,
                "slots": sum(int(v.numpy().nbytes) for v in model.optimizer.variables)}
    largest = max(sum(int(np.prod(v.shape)) * 4 for v in layer.trainable_weights)
                  for layer in model.layers)
    report({"stage": stage, "phases": rows, "peak": max(r["peak"] for r in rows.values()),
            "base": base, "held": held, "largest_layer": largest,
            "total": sum(int(np.prod(v.shape)) * 4 for v in model.trainable_weights),
            "units": None if engine is None or engine.units is None else len(engine.units),
            "loss": float(history.history["loss"][-1])})


if __name__ == "__main__":
    main()
