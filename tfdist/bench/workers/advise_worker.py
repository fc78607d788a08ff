"""Profiles one example model for the advisor, or times its training under the job's strategy.

Usage: ``python -m tfdist.bench.workers.advise_worker --example NAME --profile`` (one process:
`tfdist.advise.profile_model` on the example's model and data), or ``--train`` under any
launcher (``TFDIST_STRATEGY`` and the pipeline variables say the layout): the model is
built with ``strategy.build_model``, compiled with the example's optimizer and loss, trained for
``--warmup-steps``, then timed, each process reading ``--batch`` rows per step (a replica's
share, a worker's batch, or the global batch of a pipeline). Reports seconds per step: the median
interval between step ends over ``--repeats`` fits of ``--steps`` (``--timing intervals``), or
for asynchronous workers the median of ``(t(2S) - t(S)) / S`` (``--timing difference``).
Both reports carry the seconds this process spent on a CPU and waiting for one meanwhile
(`RUN_QUEUE`): how much the machine's load delayed it.

The examples are the repository's ``keras_examples`` (dense CNN on digits, sparse CTR, deep MLP,
the Transformer LM at `LM_SIZES`, Keras 3 only under ``tensor``): ``image``, ``ctr``, ``deep``,
``lm``; and ``null_4``, ``null_32``: chains of 4 and 32 LayerNormalizations, whose steps under
a layout are what the layout costs whatever the model, and per weight.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfdist.probe.common import apply_threads, cpu_and_wait, median, time_call
from tfdist.testing import report

_EXAMPLES_DIR = Path(__file__).resolve().parents[3] / "keras_examples"
DEEP_WIDTH, DEEP_DEPTH = 256, 8
LM_SIZES = {"vocab": 256, "seq": 32, "width": 64, "heads": 4, "blocks": 2}
"""The LM's sizes: a step of ~10-50 ms on one core at the benchmark's batch."""


def _image(keras: Any) -> tuple[Callable[[], Any], Any, Any, Callable[[], Any], Any]:
    import image_classifier

    x, y, _, _ = image_classifier.load_digits()
    return (lambda: image_classifier.build_model(keras, (8, 8, 1), 10, 1e-3), x, y,
            lambda: keras.optimizers.Adam(1e-3),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def _ctr(keras: Any) -> tuple[Callable[[], Any], Any, Any, Callable[[], Any], Any]:
    import sparse_ctr

    features, clicks, _ = sparse_ctr.generate(8192, seed=1)
    return (lambda: sparse_ctr.build_model(keras, 8, 2e-3), features, clicks[:, None],
            lambda: keras.optimizers.Adam(2e-3),
            keras.losses.BinaryCrossentropy(from_logits=True))


def _deep(keras: Any) -> tuple[Callable[[], Any], Any, Any, Callable[[], Any], Any]:
    import deep_mlp

    x, y, _, _ = deep_mlp.load_flat_digits()
    return (lambda: deep_mlp.build_model(keras, x.shape[1], 10, DEEP_WIDTH, DEEP_DEPTH), x, y,
            lambda: keras.optimizers.Adam(1e-3),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def _lm(keras: Any) -> tuple[Callable[[], Any], Any, Any, Callable[[], Any], Any]:
    import transformer_lm

    x, y = transformer_lm.counting_text(2048, LM_SIZES["seq"], LM_SIZES["vocab"], seed=1)
    return (lambda: transformer_lm.build_model(keras, **LM_SIZES), x, y,
            lambda: keras.optimizers.Adam(3e-3),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def _null(layers: int) -> Callable[[Any], tuple[Callable[[], Any], Any, Any, Callable[[], Any],
                                                 Any]]:
    """A chain of ``layers`` two-feature LayerNormalizations (2 weights each): nearly no
    compute or traffic, nothing a tensor split divides, so its step under a layout is that
    layout's own cost (the loop, the synchronisation, the stages' hand-offs, per weight)."""
    def example(keras: Any) -> tuple[Callable[[], Any], Any, Any, Callable[[], Any], Any]:
        x = np.tile(np.asarray([[0.0, 1.0]], np.float32), (64, 1))
        return (lambda: keras.Sequential([keras.Input((2,))] + [
            keras.layers.LayerNormalization(name=f"null_{i}") for i in range(layers)],
            name=f"null_{layers}"), x, x, lambda: keras.optimizers.SGD(1e-3),
            keras.losses.MeanSquaredError())
    return example


EXAMPLES: dict[str, Callable[[Any], tuple[Callable[[], Any], Any, Any, Callable[[], Any], Any]]] = {
    "image": _image, "ctr": _ctr, "deep": _deep, "lm": _lm,
    "null_4": _null(4), "null_32": _null(32)}


RUN_QUEUE = "run_queue"
"""The report's key of ``{"cpu_s", "wait_s"}``: this process's seconds on a CPU and waiting for
one while it measured (`tfdist.probe.common.cpu_and_wait`), the load it met."""


HELPER_CORES = "helper_cores"
"""The report's key of the cores this process's own threads keep busy while it does nothing
(`_idle_cores`): Horovod's background loop, a runtime's pollers; None: not measured."""


def _since(start: tuple[float, float]) -> dict[str, float]:
    cpu, wait = cpu_and_wait()
    return {"cpu_s": cpu - start[0], "wait_s": wait - start[1]}


def _rows(data: Any, count: int) -> Any:
    if isinstance(data, dict):
        return {k: np.resize(v, (count, *np.shape(v)[1:])) for k, v in data.items()}
    return np.resize(data, (count, *np.shape(data)[1:]))


def _dataset(x: Any, y: Any, batch: int) -> Any:
    import tensorflow as tf

    rows = max(batch * 8, 1024)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return (tf.data.Dataset.from_tensor_slices((_rows(x, rows), _rows(y, rows))).repeat()
            .batch(batch, drop_remainder=True).with_options(options))


def profile(args: argparse.Namespace, keras: Any) -> dict[str, Any]:
    import tfdist
    from tfdist.advise import profile_model

    build, x, y, optimizer, loss = EXAMPLES[args.example](keras)
    # Built and compiled as a one-process job does (`train`): a model made in a strategy's
    # scope steps slower than one made outside any (the deep MLP's tf-keras step at 128 rows:
    # 11.2 against 7.0 ms here), and the jobs all make theirs in one.
    strategy = tfdist.get_strategy("default")
    model = strategy.build_model(build)
    with strategy.scope():
        model.compile(optimizer=optimizer(), loss=loss)
    start = cpu_and_wait()
    measured = profile_model(model, args.batch, data=_rows(x, args.batch * 4),
                             labels=_rows(y, args.batch * 4), repeats=args.repeats).to_json()
    return {**measured, RUN_QUEUE: _since(start)}


def train(args: argparse.Namespace, keras: Any) -> dict[str, Any]:
    import tfdist

    build, x, y, optimizer, loss = EXAMPLES[args.example](keras)
    strategy = tfdist.get_strategy("auto")
    model = strategy.build_model(build)
    with strategy.scope():  # the optimizer's variables belong to the strategy too
        model.compile(optimizer=optimizer(), loss=loss)
    data = strategy.distribute_dataset(lambda _ctx: _dataset(x, y, args.batch))
    start = cpu_and_wait()
    if args.timing == "difference":
        step_s, raw = _difference(model, data, args)
    else:
        step_s, raw = _intervals(model, data, args, keras)
    queue = _since(start)
    return {"strategy": strategy.name, "raw": raw, "step_s": step_s,
            "samples_per_step": args.batch, "steps": args.steps, RUN_QUEUE: queue,
            HELPER_CORES: _idle_cores(args.idle_seconds)}


def _idle_cores(seconds: float) -> float | None:
    """CPU seconds this process spends per second asleep after training (``seconds`` of
    sleep; 0: not measured): what its strategy's helper threads take from the cores."""
    if seconds <= 0:
        return None
    start = time.process_time()
    time.sleep(seconds)
    return (time.process_time() - start) / seconds


def _intervals(model: Any, data: Any, args: argparse.Namespace, keras: Any) -> tuple[float, Any]:
    """Median time between consecutive ends of training steps (fit's start-up left out, and
    robust to the load spikes of a shared machine)."""
    import tfdist

    ends: list[float] = []
    clock = keras.callbacks.LambdaCallback(on_train_batch_end=lambda *_, **__: ends.append(
        time.perf_counter()))
    tfdist.fit(model, data, epochs=1, steps_per_epoch=args.warmup_steps, verbose=0)
    gaps: list[float] = []
    for _ in range(args.repeats):
        ends.clear()
        tfdist.fit(model, data, epochs=1, steps_per_epoch=args.steps, verbose=0,
                   callbacks=[clock])
        gaps += [b - a for a, b in itertools.pairwise(ends)]
    return median(gaps), gaps


def _difference(model: Any, data: Any, args: argparse.Namespace) -> tuple[float, Any]:
    """For asynchronous workers (fit schedules steps ahead, so step ends are not step times):
    the median over pairs of ``(t(2 S steps) - t(S steps)) / S``; fit's start-up cancels."""
    import tfdist

    run = lambda steps: time_call(lambda: tfdist.fit(  # noqa: E731
        model, data, epochs=1, steps_per_epoch=steps, verbose=0))
    run(args.warmup_steps)
    pairs = [(run(args.steps), run(2 * args.steps)) for _ in range(args.repeats)]
    return median([(long - short) / args.steps for short, long in pairs]), pairs


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", choices=sorted(EXAMPLES), required=True)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--profile", action="store_true")
    what.add_argument("--train", action="store_true")
    parser.add_argument("--batch", type=int, required=True, help="rows per process per step")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timing", choices=("intervals", "difference"), default="intervals",
                        help="per-step intervals (synchronous) or long-minus-short fits (async)")
    parser.add_argument("--idle-seconds", type=float, default=0.0,
                        help="after training, sleep this long and report the CPU this process "
                        "used meanwhile per second (its helper threads'; 0: not measured)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    apply_threads()
    sys.path.insert(0, str(_EXAMPLES_DIR))
    from tfdist.core import flavour

    report((profile if arguments.profile else train)(arguments, flavour.get_keras()))
