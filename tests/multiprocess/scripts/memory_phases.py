"""Resident memory of one training process, phase by phase: a pipeline stage, a tensor shard,
or with ``--single`` one process training the whole model (the reference).

Args: ``kind width layers micro_batches schedule optimizer [--single] [--whole-batch]
[--gpt2] [--rows N] [--save DIR]`` (``--whole-batch``: the pipeline's
``weight_gradients="whole_batch"``; ``--rows``: rows of a global batch, default `GLOBAL`;
``--save ""``: a temporary folder), ``kind`` ``pipeline`` or ``tensor``. The model is an MLP of
``layers`` square ``width`` layers, seeded (one process and the stages start from the same
weights); with ``--gpt2``, KerasHub's GPT-2 from a config (``layers`` blocks of ``width``, heads
of 64, no dropout; next-token batches of `SEQ` tokens). Each phase reports this process's
resident memory after it (``rss``) and its peak during it (``peak``), both above the memory
before the model (TensorFlow imported, the strategy made, one op run): ``build`` (the
strategy's `build_model`, or building the whole model), ``compile``, ``first`` (the first step:
tracing), ``steady`` (``STEPS`` more), ``save`` (``model.save``; the chief writes it). The
report's ``peak`` is the highest of them.

Run it under `tfdist.bench.memory.MALLOC_ENV` (resident memory then follows allocation).
"""

from __future__ import annotations

import gc
import sys
import tempfile
from pathlib import Path

import numpy as np

from tfdist.bench.memory import PeakSampler, rss_bytes
from tfdist.core import flavour
from tfdist.testing import report

FEATURES, GLOBAL, STEPS = 16, 64, 3
SEQ, VOCAB = 16, 512


def build_gpt2(width, layers):
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCAB, num_layers=layers, num_heads=width // 64, hidden_dim=width,
        intermediate_dim=4 * width, max_sequence_length=SEQ, dropout=0.0)
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def build(keras, width, layers, gpt2=False):
    if gpt2:
        keras.utils.set_random_seed(0)
        return build_gpt2(width, layers)
    keras.utils.set_random_seed(0)
    stack = [keras.Input((FEATURES,)), keras.layers.Dense(width, activation="relu", name="in")]
    for i in range(layers):
        stack.append(keras.layers.Dense(width, activation="relu", name=f"h{i}"))
    stack.append(keras.layers.Dense(1, name="out"))
    return keras.Sequential(stack, name="wide_mlp")


def _optimizer(keras, name):
    return keras.optimizers.SGD(1e-4) if name == "sgd" else keras.optimizers.Adam(1e-4)


def _rows(x, start, stop):
    """Rows ``start:stop`` of an array or of a dict of them."""
    if isinstance(x, dict):
        return {k: v[start:stop] for k, v in x.items()}
    return x[start:stop]


class Phases:
    """Each phase's resident memory after it and its peak, above ``base``."""

    def __init__(self) -> None:
        gc.collect()
        self.base, self.rows = rss_bytes(), {}

    def run(self, name, fn):
        with PeakSampler() as sampler:
            value = fn()
        gc.collect()
        self.rows[name] = {"rss": rss_bytes() - self.base, "peak": sampler.peak - self.base}
        return value


def main(argv):
    keras = flavour.get_keras()
    import tensorflow as tf

    kind, width, layers, micro, schedule, opt = argv[0], *map(int, argv[1:4]), *argv[4:6]
    rng = np.random.default_rng(0)
    gpt2 = "--gpt2" in argv
    rows = int(argv[argv.index("--rows") + 1]) if "--rows" in argv else GLOBAL
    x = rng.normal(size=(rows * (STEPS + 1), FEATURES)).astype("float32")
    y = x[:, :1] * 2
    loss = "mse"
    if gpt2:
        tokens = rng.integers(0, VOCAB, size=(rows * (STEPS + 1), SEQ + 1)).astype("int32")
        x = {"token_ids": tokens[:, :-1], "padding_mask": np.ones_like(tokens[:, 1:])}
        y, loss = tokens[:, 1:], keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    strategy = None
    if "--single" not in argv:  # first: collectives are configured before any op runs
        import tfdist

        options = {"micro_batches": micro, "schedule": schedule} if kind == "pipeline" else {}
        if "--whole-batch" in argv:
            options["weight_gradients"] = "whole_batch"
        strategy = tfdist.get_strategy("auto", **options)
    tf.constant(0.0) + 1
    phases = Phases()
    if strategy is None:
        model = phases.run("build", lambda: build(keras, width, layers, gpt2))
    else:
        model = phases.run("build", lambda: strategy.build_model(
            lambda: build(keras, width, layers, gpt2)))
    phases.run("compile", lambda: model.compile(optimizer=_optimizer(keras, opt), loss=loss))
    first, rest = _rows(x, 0, rows), _rows(x, rows, None)
    phases.run("first", lambda: model.fit(first, y[:rows], batch_size=rows, verbose=0))
    history = phases.run("steady", lambda: model.fit(rest, y[rows:], batch_size=rows,
                                                     shuffle=False, verbose=0))
    if "--save" in argv:
        path = Path(argv[argv.index("--save") + 1] or tempfile.mkdtemp()) / "model.keras"
        phases.run("save", lambda: model.save(path))
    weight_bytes = sum(int(np.prod(w.shape)) * 4 for w in model.weights)
    report({
        "where": "one process" if strategy is None else strategy.describe(),
        "weight_bytes": weight_bytes, "phases": phases.rows,
        "peak": max(r["peak"] for r in phases.rows.values()),
        "loss": history.history["loss"],
    })


if __name__ == "__main__":
    main(sys.argv[1:])
