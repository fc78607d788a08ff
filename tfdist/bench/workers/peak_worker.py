"""Peak resident memory that ``fit`` adds, for an MLP whose activations dominate its memory:
one stage of a K-stage pipeline (``--mode pipeline``, from TF_CONFIG), with or without activation
recomputation, or one process training the whole model (``--mode default``).

Usage: ``python -m tfdist.bench.workers.peak_worker --mode pipeline --micro-batches 4
--recompute``. Reports the peak's growth above the memory before ``fit`` (gradients, optimizer
slots, and the activations the schedule keeps) and the weights' bytes; run it under
`tfdist.bench.memory.MALLOC_ENV`.
"""

from __future__ import annotations

import argparse
import gc
from collections.abc import Sequence
from typing import Any

import numpy as np

from tfdist.bench.memory import PeakSampler, rss_bytes
from tfdist.bench.workers import exit_after
from tfdist.probe.common import apply_threads
from tfdist.testing import report

FEATURES = 16


def build(keras: Any, width: int, depth: int) -> Any:
    """``depth`` narrow Dense layers: with many rows, their outputs outweigh their weights."""
    layers = [keras.Input((FEATURES,))]
    layers += [keras.layers.Dense(width, activation="relu", name=f"dense_{i}")
               for i in range(depth)]
    layers.append(keras.layers.Dense(1, name="out"))
    return keras.Sequential(layers, name="activation_heavy_mlp")


def main(argv: Sequence[str] | None = None) -> str:
    """Measures and reports; returns ``--mode``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("pipeline", "default"), default="pipeline")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--schedule", default="gpipe")
    parser.add_argument("--recompute", action="store_true")
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    apply_threads()
    from tfdist.core import flavour

    keras = flavour.get_keras()
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.rows * args.steps, FEATURES)).astype("float32")
    y = x[:, :1] * 2
    stage = None
    if args.mode == "pipeline":
        import tfdist

        strategy = tfdist.get_strategy("pipeline", micro_batches=args.micro_batches,
                                       schedule=args.schedule, recompute=args.recompute)
        model = strategy.build_model(lambda: build(keras, args.width, args.depth))
        stage = strategy.stage_report()["stage"]
    else:
        model = build(keras, args.width, args.depth)
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")
    gc.collect()
    before = rss_bytes()
    with PeakSampler() as sampler:
        model.fit(x, y, batch_size=args.rows, epochs=1, shuffle=False, verbose=0)
    report({"stage": stage, "growth_bytes": sampler.peak - before,
            "weight_bytes": sum(int(np.prod(w.shape)) * 4 for w in model.weights)})
    return args.mode


if __name__ == "__main__":
    exit_after(main())
