"""The four tensor-parallel mappings on a tensor group, and the tensor layers' collectives.

Megatron-LM's mappings (``tensor_parallel/mappings.py``), each a ``tf.custom_gradient`` whose
backward is another's forward:

* `copy_to_group` (Megatron's *f*): identity forward, all-reduce (sum) of the gradient backward.
  Placed before a column-split layer: each shard's gradient of its input is partial.
* `reduce_from_group` (*g*): all-reduce (sum) forward, identity backward. Placed after a
  row-split layer: each shard's output is a partial sum.
* `scatter_to_group`: this member's slice of the last axis forward, the slices gathered back.
* `gather_from_group`: the members' slices concatenated along the last axis forward, this
  member's slice of the gradient backward.

and, without a gradient rule, `all_reduce_sum`, `all_reduce_max`, `gather_axis` and
`gather_last_axis` (for predictions and saving).

Every collective takes its group as a `tfdist.parallel.mesh.ProcessGroup` (the mesh hands it
out) and a traced instance key (`tfdist.parallel.keys.next_key`). Traced with a shape left open
(a sequence length: one trace serves batches of several lengths), it travels flat, padded to
its size class, on a block of keys (`tfdist.parallel.keys.next_sized_key`): TensorFlow keeps one
shape per key for the life of the job. Run eagerly (a gather at save)
it waits at most ``timeout`` seconds; inside a traced step it has no timeout of its own, the
step's deadline is `tfdist.watchdog`'s (`tfdist.parallel.ops.op_timeout`).

Example:
    >>> from tfdist.parallel.mesh import Mesh
    >>> group = Mesh(tensor=1).group("tensor", rank=0)
    >>> import tensorflow as tf
    >>> float(copy_to_group(tf.constant(2.0), group))   # a group of one: the identity
    2.0
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdist.parallel.keys import next_key, next_sized_key
from tfdist.parallel.mesh import ProcessGroup
from tfdist.parallel.ops import DEFAULT_TIMEOUT, all_gather, all_reduce, op_timeout, size_class

__all__ = ["DEFAULT_TIMEOUT", "next_key", "op_timeout", "all_reduce_sum", "all_reduce_max",
           "copy_to_group", "reduce_from_group", "scatter_to_group", "gather_from_group",
           "gather_axis", "gather_last_axis"]


def _open_shape(x: Any, group: ProcessGroup) -> bool:
    """Whether ``x`` is traced with a shape left open and goes over processes (sized)."""
    return (group.size > 1 and not hasattr(group, "reduce_locally")
            and not tf.executing_eagerly() and not x.shape.is_fully_defined())


def _flat_padded(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``x`` flat, padded to its size class; its element count; its class's key offset."""
    flat = tf.reshape(x, [-1])
    elements = tf.size(flat)
    cls, cap = size_class(elements)
    return tf.pad(flat, [[0, cap - elements]]), elements, cls


def _reduce(x: Any, group: ProcessGroup, op: str, timeout: float) -> Any:
    x = tf.convert_to_tensor(x)
    if not _open_shape(x, group):
        return all_reduce(x, group, op, timeout=op_timeout(timeout))
    padded, elements, cls = _flat_padded(x)
    key, stride = next_sized_key(group.key)
    total = all_reduce(padded, group, op, instance=key + cls * stride, timeout=0.0)
    out = tf.reshape(total[:elements], tf.shape(x))
    out.set_shape(x.shape)
    return out


def all_reduce_sum(x: Any, group: ProcessGroup, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """The element-wise sum of ``x`` over ``group`` (no gradient rule of its own)."""
    return _reduce(x, group, "sum", timeout)


def all_reduce_max(x: Any, group: ProcessGroup, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """The element-wise maximum of ``x`` over ``group`` (use under ``tf.stop_gradient``)."""
    return _reduce(x, group, "max", timeout)


def copy_to_group(x: Any, group: ProcessGroup, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """Identity forward; the gradient summed over ``group`` backward (Megatron's *f*)."""
    if group.size == 1:
        return x

    @tf.custom_gradient
    def copy(value: Any) -> Any:
        def grad(dy: Any) -> Any:
            return all_reduce_sum(dy, group, timeout)

        return tf.identity(value), grad

    return copy(x)


def reduce_from_group(x: Any, group: ProcessGroup, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """The sum over ``group`` forward; the gradient passed through backward (Megatron's *g*)."""
    if group.size == 1:
        return x

    @tf.custom_gradient
    def reduce(value: Any) -> Any:
        return all_reduce_sum(value, group, timeout), tf.identity

    return reduce(x)


def _own_slice(x: Any, group: ProcessGroup) -> tf.Tensor:
    """This member's ``group.rank``-th of ``group.size`` equal slices of the last axis."""
    return tf.split(x, group.size, axis=-1)[group.rank]


def scatter_to_group(x: Any, group: ProcessGroup, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """This member's slice of the last axis forward; the slices' gradients gathered backward.

    Example:
        >>> from tfdist.parallel.mesh import Mesh
        >>> scatter_to_group(tf.constant([[1.0, 2.0]]), Mesh().group("tensor", 0)).shape
        TensorShape([1, 2])
    """
    if group.size == 1:
        return x

    @tf.custom_gradient
    def scatter(value: Any) -> Any:
        return _own_slice(value, group), lambda dy: gather_last_axis(dy, group, timeout)

    return scatter(x)


def gather_from_group(x: Any, group: ProcessGroup, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """The members' slices concatenated along the last axis forward; this member's slice of
    the gradient backward (the inverse of `scatter_to_group`)."""
    if group.size == 1:
        return x

    @tf.custom_gradient
    def gather(value: Any) -> Any:
        return gather_last_axis(value, group, timeout), lambda dy: _own_slice(dy, group)

    return gather(x)


def gather_last_axis(x: Any, group: ProcessGroup, timeout: float = DEFAULT_TIMEOUT) -> Any:
    """The shards of ``group`` concatenated along the last axis, in group-rank order."""
    if group.size == 1:
        return x
    return gather_axis(x, len(x.shape) - 1, group, timeout)


def gather_axis(x: Any, axis: int, group: ProcessGroup,
                timeout: float = DEFAULT_TIMEOUT) -> tf.Tensor:
    """The shards of ``group`` concatenated along ``axis`` (no gradient rule); traced with an
    open shape, the members' lengths along ``axis`` may differ."""
    x = tf.convert_to_tensor(x)
    if not _open_shape(x, group) or x.shape.rank is None:
        return all_gather(x, group, axis, timeout=op_timeout(timeout))
    # the members' shapes first (a data replica's rows may differ by one): the largest sets
    # the size class, so every member meets on one key
    shapes = tf.reshape(all_gather(tf.shape(x, out_type=tf.int32)[tf.newaxis], group,
                                   timeout=0.0), [group.size, len(x.shape)])
    counts = tf.reduce_prod(shapes, axis=1)
    flat = tf.reshape(x, [-1])
    cls, cap = size_class(tf.reduce_max(counts))
    key, stride = next_sized_key(group.key)
    padded = tf.pad(flat, [[0, cap - tf.size(flat)]])
    rows = tf.reshape(all_gather(padded, group, instance=key + cls * stride, timeout=0.0),
                      [group.size, -1])
    out = tf.concat([tf.reshape(rows[i, :counts[i]], shapes[i]) for i in range(group.size)],
                    axis)
    shape = x.shape.as_list()
    if shape[axis] is not None:  # traced with one length, every member has it
        shape[axis] *= group.size
    out.set_shape(shape)
    return out
