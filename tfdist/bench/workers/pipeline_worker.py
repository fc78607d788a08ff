"""Times training steps of one deep MLP under ``--mode pipeline`` (one process per stage, from
TF_CONFIG), ``multi_worker`` (same processes, data parallel) or ``default`` (one process).

Usage: ``python -m tfdist.bench.workers.pipeline_worker --mode pipeline --micro-batches 4``.
Each process first times its own stage alone (forward and backward of one micro-batch, no
transfers): the GPipe bound of a step is ``(M + K - 1)`` times the slowest stage's time. Then it
times ``fit`` over ``--steps`` global batches (after a warm-up fit) and reports seconds per step.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import numpy as np

from tfdist.bench.workers.common import apply_threads, median, time_call
from tfdist.testing import report

FEATURES = 256


def build(keras: Any, width: int, depth: int) -> Any:
    """``depth`` equal Dense layers of ``width`` units: stages of equal cost for any even K."""
    layers = [keras.Input((FEATURES,))]
    layers += [keras.layers.Dense(width if i < depth - 1 else FEATURES, activation="relu",
                                  name=f"dense_{i}") for i in range(depth)]
    return keras.Sequential(layers, name="deep_mlp")


def stage_seconds(model: Any, rows: int, repeats: int = 20) -> float:
    """Median seconds of one forward and backward of ``model`` on ``rows`` rows."""
    import tensorflow as tf

    x = tf.random.normal([rows, *model.inputs[0].shape[1:]])

    @tf.function
    def step() -> Any:
        with tf.GradientTape() as tape:
            out = model(x, training=True)
            total = tf.reduce_sum(out)
        return tape.gradient(total, model.trainable_variables + [x])

    step()
    return median([time_call(step) for _ in range(repeats)])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("pipeline", "multi_worker", "default"),
                        required=True)
    parser.add_argument("--micro-batches", type=int, default=1)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    apply_threads()
    import tfdist
    from tfdist import compat

    keras = compat.get_keras()
    options = {"micro_batches": args.micro_batches} if args.mode == "pipeline" else {}
    strategy = tfdist.get_strategy(args.mode, **options)
    model = strategy.build_model(lambda: build(keras, args.width, args.depth))
    result: dict[str, Any] = {"mode": args.mode, "processes": strategy.num_workers}
    if args.mode == "pipeline":
        rows = args.batch // (args.micro_batches * strategy.num_replicas)
        result["stage_s"] = stage_seconds(model, rows)
        result["stage"] = strategy.stage_report()
    model.compile(optimizer=keras.optimizers.SGD(1e-4), loss="mse")
    samples = args.batch * args.steps
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, FEATURES)).astype("float32")
    if args.mode == "multi_worker":  # each worker reads its half of every global batch
        per = args.batch // strategy.num_replicas
        x = x.reshape(args.steps, strategy.num_replicas, per, FEATURES)[:, strategy.worker_index]
        x, batch = x.reshape(-1, FEATURES), per
    else:
        batch = args.batch
    y = x[:, :FEATURES] * 0.5
    model.fit(x[: batch * 3], y[: batch * 3], batch_size=batch, epochs=1, verbose=0)  # warm-up
    seconds = time_call(lambda: model.fit(x, y, batch_size=batch, epochs=1, verbose=0,
                                          shuffle=False))
    result["step_s"] = seconds / args.steps
    report(result)


if __name__ == "__main__":
    main()
