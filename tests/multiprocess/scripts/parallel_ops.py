"""One process of a 2-process job that runs every op of `tfdist.parallel` on its tensor group
and reports the results, which the test compares with numpy's; then, in the same job, the
mappings' gradient again with `gather_from_group`'s backward keeping the other member's slice
(the gradient rule, broken: the test must see it). Then the mappings traced once with the
sequence length left open (``[None, 4]``) and called with 2 rows, then 3 (sized keys), and a
gather whose members hold 2 and 3 rows; last, the same traced all-reduce with its sized keys
taken away (one key for every length): TensorFlow must refuse the second length.

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


def open_length(group: object, rank: int) -> dict:
    """The mappings traced once with the length left open, called with several lengths."""
    spec = [tf.TensorSpec([None, 4], tf.float32)]
    reduce_sum = tf.function(lambda v: mappings.all_reduce_sum(v, group), input_signature=spec)
    reduce_max = tf.function(lambda v: mappings.all_reduce_max(v, group), input_signature=spec)
    gather = tf.function(lambda v: mappings.gather_axis(v, 0, group), input_signature=spec)
    out: dict = {}
    for rows in (2, 3):
        x = tf.constant(np.arange(4 * rows, dtype="float32").reshape(rows, 4) * (rank + 1))
        out[f"sum_{rows}"] = reduce_sum(x).numpy().tolist()
        out[f"max_{rows}"] = reduce_max(-x).numpy().tolist()
    rows = 2 + rank  # the members' lengths differ
    out["uneven_gather"] = gather(tf.fill([rows, 4], float(rank + 1))).numpy().tolist()
    out["traces"] = [f.experimental_get_tracing_count() for f in (reduce_sum, reduce_max)]
    return out


def one_key_for_every_length(group: object) -> str:
    """The sabotage: the open-shape all-reduce on one key; returns TensorFlow's refusal."""
    keys_taken = mappings.next_sized_key
    mappings.next_sized_key = lambda group_key: (keys.next_key(group_key), 0)
    spec = [tf.TensorSpec([None, 4], tf.float32)]
    reduce_sum = tf.function(lambda v: mappings.all_reduce_sum(v, group), input_signature=spec)
    try:
        for rows in (2, 3):
            reduce_sum(tf.ones([rows, 4]))
    except tf.errors.OpError as err:
        return str(err)[:300]
    finally:
        mappings.next_sized_key = keys_taken
    return "no error"


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
    result["open"] = open_length(group, rank)
    result["one_key"] = one_key_for_every_length(group)
    report(result)
    exit_after_report()


if __name__ == "__main__":
    main()
