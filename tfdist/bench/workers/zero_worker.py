"""Times ``fit`` steps of one model under ZeRO stages 1, 2 and 3 (``--mode zero``, one job:
each stage a `ZeroStrategy` of its own in the same processes) or replicated (``--mode
multi_worker``, stage 0), and reports what each process holds and sends.

Usage: ``python -m tfdist.bench.workers.zero_worker --mode zero --width 512``. The model: an
embedding of ``--vocab`` rows, then ``--layers`` Dense layers of ``--width`` (Adam, every
process given the same global batches under ZeRO; its rows under multi_worker).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import numpy as np

from tfdist.probe.common import apply_threads, time_call
from tfdist.testing import report

SEQ, CLASSES = 8, 16


def build(keras: Any, vocab: int, width: int, layers: int) -> Any:
    """Embedding, flatten, ``layers`` x Dense(width), a classifier."""
    keras.utils.set_random_seed(0)
    tokens = keras.Input((SEQ,), dtype="int32")
    x = keras.layers.Flatten()(keras.layers.Embedding(vocab, width // SEQ)(tokens))
    for _ in range(layers):
        x = keras.layers.Dense(width, activation="relu")(x)
    return keras.Model(tokens, keras.layers.Dense(CLASSES)(x))


def timed(keras: Any, strategy: Any, args: argparse.Namespace, global_rows: bool) -> dict:
    """Warm-up fit, then ``--steps`` timed steps; seconds per step and bytes held."""
    model = strategy.build_model(lambda: build(keras, args.vocab, args.width, args.layers))
    with strategy.scope():
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.integers(0, args.vocab, (args.batch * args.steps, SEQ)).astype("int32")
    y = rng.integers(0, CLASSES, (args.batch * args.steps,)).astype("int32")
    batch = args.batch
    if not global_rows:  # multi_worker: each worker reads its rows of every global batch
        d, rank = strategy.num_replicas, strategy.worker_index
        x = x.reshape(args.steps, d, -1, SEQ)[:, rank].reshape(-1, SEQ)
        y = y.reshape(args.steps, d, -1)[:, rank].reshape(-1)
        batch //= d
    model.fit(x[: batch * 2], y[: batch * 2], batch_size=batch, epochs=1, verbose=0,
              shuffle=False)
    seconds = time_call(lambda: model.fit(x, y, batch_size=batch, epochs=1, verbose=0,
                                          shuffle=False))
    engine = getattr(model, "zero_engine", None)
    if engine is not None:
        return {"step_s": seconds / args.steps, **engine.held_bytes(), **engine.step_traffic()}
    weights = sum(int(v.numpy().nbytes) for v in model.trainable_weights)
    return {"step_s": seconds / args.steps, "weights": weights, "pieces": 0,
            "slots": sum(int(v.numpy().nbytes) for v in model.optimizer.variables),
            "sent": int(2 * (strategy.num_replicas - 1) / strategy.num_replicas * weights)}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("zero", "multi_worker"), required=True)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--only", type=int, choices=(1, 2, 3),
                        help="run this stage alone (its process's peak RSS is then its own)")
    args = parser.parse_args(argv)
    apply_threads()
    import keras

    import tfdist

    if args.mode == "multi_worker":
        report({"0": {**timed(keras, tfdist.get_strategy("multi_worker"), args, False),
                      "peak_rss": peak_rss()}})
        return
    stages = (args.only,) if args.only else (1, 2, 3)
    result = {str(stage): timed(keras, tfdist.get_strategy("multi_worker", zero=stage), args,
                                True) for stage in stages}
    if args.only:
        result[str(args.only)]["peak_rss"] = peak_rss()
    report(result)


def peak_rss() -> int:
    """This process's peak resident bytes so far (Linux reports KiB)."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


if __name__ == "__main__":
    main()
