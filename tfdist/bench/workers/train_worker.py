"""Trains one small model under several set-ups in one process, interleaved, and times each fit.

Usage: ``python -m tfdist.bench.workers.train_worker --mode default|multi_worker|horovod``
(multi_worker: one process per task of TF_CONFIG; horovod: under ``horovodrun``). tf-keras
throughout (multi-worker ``fit`` needs it on TF 2.21; Horovod's own Keras optimizer too).

Variants per mode (``tfdist`` is the library's way, ``raw`` the plain TF/Horovod way):

* default: tfdist ``get_strategy("default")`` vs ``tf.distribute.OneDeviceStrategy``.
* multi_worker: tfdist ``MultiWorkerMirroredStrategy`` vs ``tf.distribute``'s, same options;
  ``--variant`` picks one per process (a second multi-worker strategy in one process can hang
  while the collectives are re-configured), and the runner alternates jobs instead.
* horovod: tfdist ``HorovodStrategy``, ``tfdist.horovod.DistributedOptimizer`` (``tfdist_opt``)
  and ``horovod.tensorflow.keras.DistributedOptimizer`` (``raw``).

default and horovod also train ``raw_control``, a second copy of ``raw``: its "overhead" over
``raw`` is the A/A noise floor of the measurement (what a zero-cost wrapper would show).

Every repeat runs one ``fit`` of each variant, rotating the order (A B, B A, ...), so drift on a
shared machine cancels in the paired ratios. Reports seconds per fit and samples per fit.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist.bench.workers import exit_after
from tfdist.probe.common import apply_threads, time_call
from tfdist.testing import report

FEATURES, CLASSES, HIDDEN, SAMPLES = 128, 10, 256, 4096


def build_model(keras: Any, optimizer: Any) -> Any:
    """A 3-layer MLP (about 100k parameters) compiled with ``optimizer``."""
    model = keras.Sequential([keras.layers.Input((FEATURES,)),
                              keras.layers.Dense(HIDDEN, activation="relu"),
                              keras.layers.Dense(HIDDEN, activation="relu"),
                              keras.layers.Dense(CLASSES)])
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def dataset(batch: int) -> tf.data.Dataset:
    """Synthetic data, the same on every rank, repeated, in batches of ``batch``."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(SAMPLES, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, size=SAMPLES)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch).with_options(options)


Variant = tuple[Any, tf.data.Dataset, list[Any], int]  # model, data, callbacks, samples per step


def _under(strategy: Any, keras: Any, per_replica: int) -> Variant:
    with strategy.scope():
        model = build_model(keras, keras.optimizers.SGD(0.01))
    batch = per_replica * strategy.num_replicas_in_sync
    return model, dataset(batch), [], batch


def _default(args: argparse.Namespace, keras: Any) -> dict[str, Variant]:
    import tfdist.strategies

    return {"tfdist": _under(tfdist.strategies.get_strategy("default"), keras, args.batch),
            "raw": _under(tf.distribute.OneDeviceStrategy("/cpu:0"), keras, args.batch),
            "raw_control": _under(tf.distribute.OneDeviceStrategy("/cpu:0"), keras, args.batch)}


def _multi_worker(args: argparse.Namespace, keras: Any) -> dict[str, Variant]:
    import tfdist.strategies
    from tfdist.strategies.multi_worker import communication_options

    options = dict(implementation=args.implementation, bytes_per_pack=args.bytes_per_pack)
    if args.variant == "tfdist":
        strategy = tfdist.strategies.get_strategy("multi_worker", startup_timeout_seconds=120,
                                                  **options)
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=communication_options(**options))
    return {args.variant: _under(strategy, keras, args.batch)}


def _horovod(args: argparse.Namespace, keras: Any) -> dict[str, Variant]:
    import horovod.tensorflow.keras as hvd_keras

    import tfdist.horovod as thvd
    import tfdist.strategies

    ours = tfdist.strategies.get_strategy("horovod")
    size = thvd.size()
    variants = {"tfdist": _under(ours, keras, args.batch)}
    opt = thvd.DistributedOptimizer(keras.optimizers.SGD(0.01))
    variants["tfdist_opt"] = (build_model(keras, opt), dataset(args.batch),
                              [thvd.BroadcastVariablesCallback(0)], args.batch * size)
    for name in ("raw", "raw_control"):
        raw_opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.01))
        variants[name] = (build_model(keras, raw_opt), dataset(args.batch),
                          [hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)],
                          args.batch * size)
    return variants


MODES: dict[str, Callable[[argparse.Namespace, Any], dict[str, Variant]]] = {
    "default": _default, "multi_worker": _multi_worker, "horovod": _horovod}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Warm-up fit per variant, then ``repeats`` rounds of one timed fit each (rotating order)."""
    import tf_keras as keras

    variants = MODES[args.mode](args, keras)
    names = list(variants)
    for model, data, callbacks, _ in variants.values():
        model.fit(data, epochs=1, steps_per_epoch=args.warmup_steps, verbose=0,
                  callbacks=callbacks)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            model, data, _, _ = variants[name]
            seconds[name].append(time_call(lambda m=model, d=data: m.fit(
                d, epochs=1, steps_per_epoch=args.steps, verbose=0)))
    return {"mode": args.mode, "seconds": seconds,
            "samples_per_fit": {n: v[3] * args.steps for n, v in variants.items()}}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=sorted(MODES), required=True)
    parser.add_argument("--batch", type=int, default=64, help="per replica")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--implementation", default="ring")
    parser.add_argument("--bytes-per-pack", type=int, default=0)
    parser.add_argument("--variant", choices=("tfdist", "raw"), default="tfdist",
                        help="multi_worker only: which strategy this job uses")
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    apply_threads()
    report(measure(arguments))
    exit_after(arguments.mode)
