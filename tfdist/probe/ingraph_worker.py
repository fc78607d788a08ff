"""Times chains of in-graph all-reduces on the tensor strategy's collective runtime and group.

Usage: ``python -m tfdist.probe.ingraph_worker --sizes 4096,... --counts 1,4,16`` once per task
of TF_CONFIG (workers only). Each process joins the job's collectives as the ``tensor`` strategy
does (`tfdist.parallel.runtime.enable_collectives`), takes the tensor group of a
``Mesh(tensor=P)`` and, for every size and count ``N``, times calls of one ``tf.function`` that
all-reduces a float32 tensor ``N`` times back to back, each sum feeding the next
(`tfdist.parallel.mappings.all_reduce_sum`, as a split layer's forward and backward issue them).
Reports this rank's seconds per call by size and count: the slope in ``N`` is one in-graph
all-reduce, the intercept the call's dispatch and wait, which a training step pays once.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from tfdist.probe.common import apply_threads, time_call
from tfdist.testing import report


def _chain(group: Any, count: int) -> Any:
    import tensorflow as tf

    from tfdist.parallel.mappings import all_reduce_sum

    @tf.function
    def chain(x: tf.Tensor) -> tf.Tensor:
        for _ in range(count):
            x = all_reduce_sum(x, group) * (1.0 / group.size)  # ones stay ones
        return x

    return chain


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Joins the collectives, times every (size, count); returns this rank's seconds."""
    import numpy as np
    import tensorflow as tf

    from tfdist.cluster import read_tf_config
    from tfdist.parallel.mesh import TENSOR
    from tfdist.parallel.place import process_place
    from tfdist.parallel.runtime import enable_collectives

    cluster, task = read_tf_config(None)
    place = process_place(tensor="all")  # every process in one tensor group
    group = place.group(TENSOR)
    enable_collectives(cluster, task)
    seconds: dict[str, dict[str, list[float]]] = {}
    for nbytes in args.sizes:
        x = tf.ones([nbytes // 4], tf.float32)
        for count in args.counts:
            chain = _chain(group, count)
            first = chain(x).numpy()[:4]  # traces: the same order, so the same keys, everywhere
            if not np.allclose(first, 1.0):
                raise RuntimeError(f"in-graph all-reduce chain of ones gave {first}")
            for _ in range(args.warmup):
                chain(x)
            times = [time_call(lambda c=chain, x=x: c(x).numpy()) for _ in range(args.repeats)]
            seconds.setdefault(str(nbytes), {})[str(count)] = times
    return {"rank": place.rank, "np": place.mesh.size, "seconds": seconds}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ints = lambda s: [int(v) for v in s.split(",")]  # noqa: E731
    parser.add_argument("--sizes", type=ints, required=True, help="bytes, comma-separated")
    parser.add_argument("--counts", type=ints, required=True, help="all-reduces per call")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    apply_threads()
    report(measure(arguments))
