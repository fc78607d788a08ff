"""Times one backend's all-reduce and the loopback TCP ring, interleaved, at each message size.

Usage: ``python -m tfdist.probe.allreduce_worker --backend tf|horovod --sizes 4096,...``
once per rank (TF: one process per task of TF_CONFIG; Horovod: under ``horovodrun``), with
`common.RING_PORTS_ENV` naming the ring's ports. For every size: warm-up calls, then repeats of
(all-reduce, TCP exchange) pairs, each started together on all ranks. Reports per-rank seconds.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from tfdist.probe.common import TcpRing, apply_threads, time_call
from tfdist.testing import exit_after_report, report

Setup = tuple[int, int, Callable[[Any], Any], Callable[[], None]]


def _tf_backend(args: argparse.Namespace) -> Setup:
    """Rank, size, all-reduce and barrier of TF's multi-worker collectives (tfdist's MWMS)."""
    import tensorflow as tf

    import tfdist.strategies

    strategy = tfdist.strategies.get_strategy(
        "multi_worker", implementation=args.implementation, bytes_per_pack=args.bytes_per_pack,
        startup_timeout_seconds=120)

    @tf.function
    def allreduce(x: tf.Tensor) -> Any:
        def step() -> tf.Tensor:
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(x))

        return strategy.experimental_local_results(strategy.run(step))[0]

    token = tf.ones([1])
    return strategy.worker_index, strategy.num_workers, allreduce, lambda: allreduce(token)


def _horovod_backend(args: argparse.Namespace) -> Setup:
    """Rank, size, all-reduce and barrier of ``hvd.allreduce`` (Gloo) inside ``tf.function``."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    compression = hvd.Compression.fp16 if args.compression == "fp16" else hvd.Compression.none

    @tf.function
    def allreduce(x: tf.Tensor) -> Any:
        return hvd.allreduce(x, op=hvd.Sum, compression=compression,
                             name=f"bench_{x.shape.num_elements()}")

    token = tf.ones([1])
    return hvd.rank(), hvd.size(), allreduce, lambda: allreduce(token)


BACKENDS = {"tf": _tf_backend, "horovod": _horovod_backend}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Runs the interleaved measurement; returns this rank's times by size."""
    import numpy as np
    import tensorflow as tf

    rank, size, allreduce, barrier = BACKENDS[args.backend](args)
    ring = TcpRing.from_env(rank)
    result: dict[str, Any] = {"rank": rank, "np": size, "sizes": {}}
    for nbytes in args.sizes:
        x = tf.ones([nbytes // 4], tf.float32)
        first = allreduce(x)
        if not np.allclose(first.numpy()[:4], size):
            raise RuntimeError(f"all-reduce of ones gave {first.numpy()[:4]}, expected {size}")
        for _ in range(args.warmup):
            allreduce(x)
            ring.exchange(nbytes)
        reduce_s, tcp_s, copy_s = [], [], []
        source, target = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
        for _ in range(args.repeats):
            barrier()
            reduce_s.append(time_call(lambda x=x: allreduce(x)))
            tcp_s.append(ring.timed_exchange(nbytes))
            copy_s.append(time_call(lambda s=source, t=target: np.copyto(t, s)))
        result["sizes"][str(nbytes)] = {"allreduce_s": reduce_s, "tcp_s": tcp_s,
                                        "copy_s": copy_s}
    ring.close()
    return result


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=sorted(BACKENDS), required=True)
    parser.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")], required=True)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--implementation", default="ring", help="TF only: ring or auto")
    parser.add_argument("--bytes-per-pack", type=int, default=0, help="TF only")
    parser.add_argument("--compression", default="none", help="Horovod only: none or fp16")
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    apply_threads()
    report(measure(arguments))
    exit_after_report()
