"""Trains a small sparse (embedding) CTR model, async on parameter servers or sync multi-worker.

Usage (a path, run by `tfdist.testing.run_cluster`):

* ``ps_worker.py --mode ps``: on the chief of a cluster with ``ps`` tasks; workers and ps run
  ``python -m tfdist.server``. Variables are split over the ps (``num_shards`` = number of ps).
* ``ps_worker.py --mode sync``: on every worker, `MultiWorkerMirroredStrategy`.

One model per ``--spe`` value (``steps_per_execution``), all built first, then timed ``fit``
calls of each in rotating order (A B, B A, ...). Reports seconds and samples per fit.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist.cluster import peek_tf_config
from tfdist.probe.common import apply_threads, time_call
from tfdist.testing import report

VOCAB, EMBED, SLOTS, DENSE, SAMPLES = 50_000, 16, 8, 8, 4096


def build_model(keras: Any, spe: int) -> Any:
    """Embeddings of ``SLOTS`` categorical ids plus dense features -> MLP -> click probability."""
    ids = keras.layers.Input((SLOTS,), dtype="int64", name="category_ids")
    dense = keras.layers.Input((DENSE,), name="dense_features")
    embedded = keras.layers.Flatten()(keras.layers.Embedding(VOCAB, EMBED)(ids))
    hidden = keras.layers.Dense(64, activation="relu")(
        keras.layers.Concatenate()([embedded, dense]))
    model = keras.Model([ids, dense], keras.layers.Dense(1, activation="sigmoid")(hidden))
    model.compile(optimizer=keras.optimizers.Adagrad(0.05), loss="binary_crossentropy",
                  steps_per_execution=spe)
    return model


def make_dataset(batch: int) -> tf.data.Dataset:
    """Synthetic clicks: Zipf-like ids, a label that depends on them; repeated, batched."""
    rng = np.random.default_rng(0)
    ids = np.minimum(rng.zipf(1.3, size=(SAMPLES, SLOTS)), VOCAB - 1).astype("int64")
    dense = rng.normal(size=(SAMPLES, DENSE)).astype("float32")
    label = ((ids[:, 0] % 7 == 0) ^ (dense[:, 0] > 0)).astype("float32")[:, None]
    return tf.data.Dataset.from_tensor_slices(((ids, dense), label)).repeat().batch(batch)


def _strategy(mode: str, num_ps: int) -> Any:
    import tfdist.strategies

    if mode == "ps":
        shards = {"num_shards": num_ps} if num_ps > 1 else {}
        return tfdist.strategies.get_strategy("parameter_server", startup_timeout_seconds=120,
                                              **shards)
    return tfdist.strategies.get_strategy("multi_worker", implementation="ring",
                                          startup_timeout_seconds=120)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import tf_keras as keras

    num_ps = peek_tf_config().count("ps")
    strategy = _strategy(args.mode, num_ps)
    batch = args.batch * (strategy.num_replicas_in_sync if args.mode == "sync" else 1)
    with strategy.scope():
        models = {f"spe{spe}": build_model(keras, spe) for spe in args.spe}
    if args.mode == "ps":
        data = strategy.distribute_dataset(lambda ctx: make_dataset(batch))
    else:
        data = make_dataset(batch)
    names = list(models)
    for name in names:
        models[name].fit(data, epochs=1, steps_per_epoch=args.warmup_steps, verbose=0)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            seconds[name].append(time_call(lambda m=models[name]: m.fit(
                data, epochs=1, steps_per_epoch=args.steps, verbose=0)))
    return {"mode": args.mode, "num_ps": num_ps, "seconds": seconds,
            "samples_per_fit": {name: batch * args.steps for name in names}}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("ps", "sync"), required=True)
    parser.add_argument("--batch", type=int, default=256, help="per worker step")
    parser.add_argument("--steps", type=int, default=100, help="a multiple of every --spe")
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--spe", type=lambda s: [int(v) for v in s.split(",")], default=[1, 10])
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    apply_threads()
    report(measure(arguments))
    # The coordinator's threads can abort a normal interpreter exit ("terminate called ...
    # exception not rethrown", exit -6: seen once in the quick benchmark under load); the
    # result is out, so leave at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
