"""The four tensor-parallel mappings on a tensor group, over TensorFlow's collective ops.

Megatron-LM's pair (``tensor_parallel/mappings.py``), each a ``tf.custom_gradient`` whose
backward is the other's forward:

* `copy_to_group` (Megatron's *f*): identity forward, all-reduce (sum) of the gradient backward.
  Placed before a column-split layer: each shard's gradient of its input is partial.
* `reduce_from_group` (*g*): all-reduce (sum) forward, identity backward. Placed after a
  row-split layer: each shard's output is a partial sum.

and `gather_last_axis` (all-gather of shards along the last axis, for predictions and saving).

Every collective takes its group as a `tfdist.mesh.ProcessGroup` (the mesh hands it out). Run
eagerly (a gather at save) it waits at most ``timeout`` seconds; inside a
traced step it has no timeout of its own, the step's deadline is `tfdist.watchdog`'s
(TensorFlow's per-op timer is a thread sleeping for the whole timeout, one per op run).
Instance keys are handed out at trace time by `next_key`, in
the order the program traces its collectives: every process of a tensor group runs the same
script and traces the same functions in the same order, so the n-th collective traced gets the
same key everywhere, and a retrace (a new shape) gets new keys (TensorFlow refuses one instance
key used with two shapes).

Example:
    >>> from tfdist.mesh import Mesh
    >>> group = Mesh(tensor=1).group("tensor", rank=0)
    >>> import tensorflow as tf
    >>> float(copy_to_group(tf.constant(2.0), group))   # a group of one: the identity
    2.0
"""

from __future__ import annotations

import itertools
from typing import Any

import tensorflow as tf
from tensorflow.python.ops import collective_ops

from tfdist.mesh import ProcessGroup

__all__ = ["DEFAULT_TIMEOUT", "next_key", "op_timeout", "all_reduce_sum", "all_reduce_max",
           "copy_to_group", "reduce_from_group", "gather_last_axis"]

DEFAULT_TIMEOUT = 300.0
"""Seconds a collective of the tensor layers waits for its group by default."""

KEY_BASE = 1 << 30
"""Tensor-layer instance keys start here: above every `tfdist.pipeline.transport` key."""
_counter = itertools.count()


def next_key() -> int:
    """A fresh instance key (the next in this process's trace order)."""
    return KEY_BASE + next(_counter)


def op_timeout(timeout: float) -> float:
    """``timeout`` for an op run eagerly; 0 (none) inside a traced step, whose deadline is the
    step watchdog's (`tfdist.watchdog`).

    Example:
        >>> op_timeout(30.0), float(tf.function(lambda: tf.constant(op_timeout(30.0)))())
        (30.0, 0.0)
    """
    return timeout if tf.executing_eagerly() else 0.0


def _reduce(x: Any, group: ProcessGroup, op: str, timeout: float) -> tf.Tensor:
    local = getattr(group, "reduce_locally", None)  # `tfdist.tensor.check`: T shards, 1 process
    if local is not None:
        return local(x, op)
    return collective_ops.all_reduce_v2(
        x, group_size=group.size, group_key=group.key, instance_key=next_key(),
        merge_op=op, final_op="Id", timeout=op_timeout(timeout))


def all_reduce_sum(x: Any, group: ProcessGroup, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """The element-wise sum of ``x`` over ``group`` (no gradient rule of its own)."""
    return x if group.size == 1 else _reduce(x, group, "Add", timeout)


def all_reduce_max(x: Any, group: ProcessGroup, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """The element-wise maximum of ``x`` over ``group`` (use under ``tf.stop_gradient``)."""
    return x if group.size == 1 else _reduce(x, group, "Max", timeout)


def copy_to_group(x: Any, group: ProcessGroup, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """Identity forward; the gradient summed over ``group`` backward (Megatron's *f*)."""
    if group.size == 1:
        return x

    @tf.custom_gradient
    def copy(value: Any) -> Any:
        def grad(dy: Any) -> Any:
            return _reduce(dy, group, "Add", timeout)

        return tf.identity(value), grad

    return copy(x)


def reduce_from_group(x: Any, group: ProcessGroup, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """The sum over ``group`` forward; the gradient passed through backward (Megatron's *g*)."""
    if group.size == 1:
        return x

    @tf.custom_gradient
    def reduce(value: Any) -> Any:
        return _reduce(value, group, "Add", timeout), tf.identity

    return reduce(x)


def gather_last_axis(x: Any, group: ProcessGroup, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """The shards of ``group`` concatenated along the last axis, in group-rank order."""
    if group.size == 1:
        return x
    return gather_axis(x, len(x.shape) - 1, group, timeout)


def gather_axis(x: Any, axis: int, group: ProcessGroup,
                timeout: float = DEFAULT_TIMEOUT) -> tf.Tensor:
    """The shards of ``group`` concatenated along ``axis`` (no gradient rule)."""
    x = tf.convert_to_tensor(x)
    if group.size == 1:
        return x
    order = [axis, *(i for i in range(len(x.shape)) if i != axis)]
    moved = tf.transpose(x, order) if axis else x
    gathered = collective_ops.all_gather_v2(
        moved, group_size=group.size, group_key=group.key, instance_key=next_key(),
        timeout=op_timeout(timeout))
    inverse = [order.index(i) for i in range(len(order))]
    return tf.transpose(gathered, inverse) if axis else gathered
