"""A stage's gradients in the form one-device Keras gives them to the optimizer (graph code).

On one device, ``GradientTape`` hands an `Embedding`'s table an ``IndexedSlices`` with one row per
looked-up id (repeated ids repeated), and adaptive optimizers depend on that form: Keras 3's Adam
squares each row before summing the repeats. So the pipeline keeps it:

* `add` accumulates a micro-batch's gradient into the step's sum as it comes: dense tensors are
  added; two ``IndexedSlices`` are concatenated (micro-batch ``m``'s rows after those of
  ``0..m-1``: the whole batch's rows in batch order, as one tape over the whole batch gives
  them); a dense and a sparse one are added densely, as TensorFlow aggregates them.
* `average_over_group` averages over the D replicas of a stage: dense gradients with an
  all-reduce, ``IndexedSlices`` by gathering every replica's rows (replica order, which is batch
  order) with their values divided by D.
* `markers` are the tensors a schedule's next op waits for, so that micro-batch ``m``'s
  gradients are added into the sums before the next op starts: at most one micro-batch's
  weight gradients exist besides the sums (see `tfdist.pipeline.engine`).

Example:
    >>> import tensorflow as tf
    >>> a = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([0, 1]), tf.constant([4, 3]))
    >>> b = tf.IndexedSlices(tf.ones([1, 3]), tf.constant([1]), tf.constant([4, 3]))
    >>> total = add(a, b)
    >>> type(total).__name__, total.indices.numpy().tolist()
    ('IndexedSlices', [0, 1, 1])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from tensorflow.python.ops import collective_ops

from tfdist.parallel.keys import REDUCE, TRAIN, instance_key
from tfdist.parallel.mappings import gather_axis
from tfdist.parallel.mesh import ProcessGroup

__all__ = ["add", "accumulate", "average_over_group", "markers", "is_sparse"]

GATHER_INDEX = 1 << 11
"""Offset of the instance index of a sparse gradient's gather (its values; indices one more)."""


def is_sparse(gradient: Any) -> bool:
    """Whether ``gradient`` is an ``IndexedSlices`` (an embedding-like gradient)."""
    return isinstance(gradient, tf.IndexedSlices)


def add(total: Any | None, gradient: Any | None) -> Any | None:
    """``total + gradient`` in the form one tape over both micro-batches would give.

    Example:
        >>> float(add(tf.constant(1.0), tf.constant(2.0)))
        3.0
    """
    if gradient is None:
        return total
    if total is None:
        return gradient
    if is_sparse(total) and is_sparse(gradient):
        return tf.IndexedSlices(tf.concat([total.values, gradient.values], 0),
                                tf.concat([total.indices, gradient.indices], 0),
                                total.dense_shape)
    return tf.convert_to_tensor(total) + tf.convert_to_tensor(gradient)


def accumulate(sums: list[Any], gradients: Sequence[Any]) -> None:
    """Adds ``gradients`` into ``sums`` in place (None: no gradient, left as it is)."""
    for i, gradient in enumerate(gradients):
        sums[i] = add(sums[i], gradient)


def markers(sums: Sequence[Any]) -> list[Any]:
    """The tensors that hold ``sums`` (an ``IndexedSlices``'s values), to wait for."""
    return [g.values if is_sparse(g) else g for g in sums if g is not None]


def _gather(tensor: Any, group: ProcessGroup, key: int, timeout: float) -> Any:
    return collective_ops.all_gather_v2(tensor, group_size=group.size, group_key=group.key,
                                        instance_key=key, timeout=timeout)


def average_over_group(gradients: Sequence[Any], group: ProcessGroup, kind: int = REDUCE,
                       phase: int = TRAIN, timeout: float = 0.0) -> list[Any]:
    """The mean of each gradient over the members of ``group`` (the D replicas of a stage).

    Dense gradients are all-reduced (instance index ``i``); an ``IndexedSlices`` is gathered
    (every replica's rows; where the step is traced with an open row count, padded to a size
    class), its values divided by ``group.size``: the form one device gives for the whole batch.
    """
    if group.size == 1:
        return list(gradients)
    averaged = []
    for i, g in enumerate(gradients):
        if is_sparse(g) and g.values.shape[0] is None:
            # traced with an open row count (a KerasHub batch's sequence length): TensorFlow
            # keeps one shape per key, so the rows travel padded to a size class on keys of it
            values = gather_axis(g.values, 0, group, timeout)
            indices = gather_axis(g.indices, 0, group, timeout)
            averaged.append(tf.IndexedSlices(values / group.size, indices, g.dense_shape))
        elif is_sparse(g):
            key = instance_key(kind, 0, GATHER_INDEX + 2 * i, phase)
            values = _gather(g.values, group, key, timeout)
            indices = _gather(g.indices, group, key + 1, timeout)
            averaged.append(tf.IndexedSlices(values / group.size, indices, g.dense_shape))
        else:
            averaged.append(collective_ops.all_reduce_v2(
                g, group_size=group.size, group_key=group.key,
                instance_key=instance_key(kind, 0, i, phase), merge_op="Add",
                final_op="Id", timeout=timeout) / group.size)
    return averaged
