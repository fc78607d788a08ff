"""One process of a 2-process job that runs every op of `tfdist.parallel` on its tensor group
and reports the results, which the test compares with numpy's; then, in the same job, the
mappings' gradient again with `gather_from_group`'s backward keeping the other member's slice
(the gradient rule, broken: the test must see it).

Each rank ``r`` holds ``x_r = arange(8).reshape(2, 4) * (r + 1) - r``."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdist.cluster import read_tf_config
from tfdist.parallel import keys, mappings, ops, process_place, runtime
from tfdist.testing import exit_after_report, report


def through_the_mappings(x: tf.Tensor, group: object) -> tuple[list, list]:
    """``gather(scatter(x))`` and the gradient of ``sum(w * it)`` by ``x`` (``w`` = 1..8)."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        whole = mappings.gather_from_group(mappings.scatter_to_group(x, group), group)
        weight = tf.constant(np.arange(8, dtype="float32").reshape(2, 4) + 1)
        loss = tf.reduce_sum(weight * whole)
    return whole.numpy().tolist(), tape.gradient(loss, x).numpy().tolist()


def main() -> None:
    cluster, task = read_tf_config(None)
    place = process_place(tensor="all")
    runtime.join(cluster, task, place.world())
    group, rank = place.group("tensor"), place.rank
    x = tf.constant(np.arange(8, dtype="float32").reshape(2, 4) * (rank + 1) - rank)
    result = {op: ops.all_reduce(x, group, op).numpy().tolist() for op in ("sum", "mean", "max")}
    result["gather"] = ops.all_gather(x, group, axis=1).numpy().tolist()
    result["scatter"] = ops.reduce_scatter(x, group, axis=1).numpy().tolist()
    link = ops.Link(place.pair(1 - rank), timeout=60.0)
    if rank == 0:
        link.send(x, keys.ACTIVATION, micro_batch=3)
    else:
        result["received"] = link.recv([2, 4], tf.float32, keys.ACTIVATION, 3).numpy().tolist()
    result["whole"], result["grad"] = through_the_mappings(x, group)
    mappings._own_slice = lambda value, g: tf.split(value, g.size, axis=-1)[1 - g.rank]
    result["sabotaged_grad"] = through_the_mappings(x, group)[1]
    report(result)
    exit_after_report()


if __name__ == "__main__":
    main()
