"""Collectives on a `ProcessGroup` over TensorFlow's collective runtime.

With collectives enabled on every process of the job (`tfdist.parallel.runtime`), these move
tensors between the members of a group: send/recv (`Link`, a broadcast in a group of two),
broadcast, all-reduce (sum, mean, max), all-gather and reduce-scatter. Each takes its group from
the mesh (`tfdist.parallel.mesh`) and its instance key from `tfdist.parallel.keys` (a named key
passed as ``instance``, or, when None, the next traced key); none makes a key of its own.

``timeout`` is in seconds (0: wait forever) and applies as given, traced or not; the tensor
mappings (`tfdist.parallel.mappings`) pass `op_timeout` of theirs, so that inside a traced step
the step's own deadline rules (`tfdist.watchdog`).

Inside a ``tf.function`` an op whose output nothing uses is pruned: a pruned send leaves its
receiver waiting forever. Callers tie every send to the step's outputs
(``tf.control_dependencies``); `Link.send` returns the op's output for that.

Example:
    >>> from tfdist.parallel.mesh import Mesh, pair_group
    >>> link = Link(pair_group(3, 2))
    >>> link.rank, link.peer, link.group.key
    (3, 2, 1056771)
    >>> alone = Mesh().group("tensor", rank=0)        # a group of one: every op is the identity
    >>> float(all_reduce(tf.constant(2.0), alone, "max"))
    2.0
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

import tensorflow as tf
from tensorflow.python.ops import collective_ops

from tfdist.errors import StrategyConfigError, format_error
from tfdist.parallel.keys import (
    REDUCE,
    SIZE_CLASSES,
    TRAIN,
    class_capacity,
    instance_key,
    next_key,
    sized_key,
)
from tfdist.parallel.mesh import ProcessGroup

__all__ = ["DEFAULT_TIMEOUT", "Link", "op_timeout", "group_broadcast", "broadcast_variable",
           "size_class", "sized_broadcast",
           "all_reduce", "all_reduce_mean", "all_gather", "reduce_scatter"]

DEFAULT_TIMEOUT = 300.0
"""Seconds a collective of the tensor layers waits for its group by default."""

Reduction = Literal["sum", "mean", "max"]
_MERGE = {"sum": "Add", "mean": "Add", "max": "Max"}


def op_timeout(timeout: float) -> float:
    """``timeout`` for an op run eagerly; 0 (none) inside a traced step, whose deadline is the
    step watchdog's (`tfdist.watchdog`: TensorFlow's per-op timer is a thread sleeping for the
    whole timeout, one per op run).

    Example:
        >>> op_timeout(30.0), float(tf.function(lambda: tf.constant(op_timeout(30.0)))())
        (30.0, 0.0)
    """
    return timeout if tf.executing_eagerly() else 0.0


def _key(instance: Any | None, group: ProcessGroup) -> Any:
    return next_key(group.key) if instance is None else instance


@dataclasses.dataclass(frozen=True)
class Link:
    """Send and receive between this rank and its peer: a group of two.

    Attributes:
        group: The pair's group (`tfdist.parallel.mesh.Mesh.pair`).
        timeout: Seconds each transfer may wait for the peer (0: forever).
    """

    group: ProcessGroup
    timeout: float = 0.0

    @property
    def rank(self) -> int:
        return self.group.members[self.group.rank]

    @property
    def peer(self) -> int:
        return self.group.peer

    def send(self, tensor: Any, kind: int, micro_batch: int = 0, index: int = 0,
             phase: int = TRAIN) -> tf.Tensor:
        """Sends ``tensor`` to the peer; tie the result to the step's outputs."""
        return group_broadcast(tensor, None, tensor.dtype, group=self.group,
                               instance=instance_key(kind, micro_batch, index, phase),
                               timeout=self.timeout)

    def recv(self, shape: Any, dtype: tf.DType, kind: int, micro_batch: int = 0,
             index: int = 0, phase: int = TRAIN) -> tf.Tensor:
        """Receives the tensor the peer sends with the same kind, micro-batch, index, phase."""
        return group_broadcast(None, shape, dtype, group=self.group,
                               instance=instance_key(kind, micro_batch, index, phase),
                               timeout=self.timeout)

    def send_sized(self, tensor: Any, kind: int, micro_batch: int = 0, index: int = 0,
                   phase: int = TRAIN) -> tf.Tensor:
        """`send` for a tensor whose shape changes from step to step (`sized_broadcast`)."""
        return sized_broadcast(tensor, None, tensor.dtype, group=self.group,
                               instance=sized_key(kind, micro_batch, index, phase),
                               timeout=self.timeout)

    def recv_sized(self, shape: Any, dtype: tf.DType, kind: int, micro_batch: int = 0,
                   index: int = 0, phase: int = TRAIN) -> tf.Tensor:
        """Receives what `send_sized` sends (``shape``: this step's, a tensor)."""
        return sized_broadcast(None, shape, dtype, group=self.group,
                               instance=sized_key(kind, micro_batch, index, phase),
                               timeout=self.timeout)


def group_broadcast(value: Any | None, shape: Any, dtype: Any, *, group: ProcessGroup,
                    instance: int | None = None, timeout: float = 0.0) -> tf.Tensor:
    """``value`` from the one member that passes it to every member of ``group``.

    The source passes ``value`` (and gets it back); the others pass None, with the ``shape``
    (a tensor is fine) and ``dtype`` they expect.
    """
    if value is not None:
        return collective_ops.broadcast_send_v2(
            value, group_size=group.size, group_key=group.key,
            instance_key=_key(instance, group),
            timeout=timeout)
    return collective_ops.broadcast_recv_v2(
        shape, dtype, group_size=group.size, group_key=group.key,
        instance_key=_key(instance, group),
        timeout=timeout)


_CAPACITIES = tuple(class_capacity(c) for c in range(SIZE_CLASSES))
"""Each size class's capacity, increasing with the class."""


def size_class(elements: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """``(size_class, capacity)`` of a flat transfer of ``elements`` (a scalar tensor), as
    `tfdist.parallel.keys.capacity` gives them: the first class whose capacity holds them (one
    search of a constant table, ~10 graph nodes, not ~45 of bit arithmetic).

    Example:
        >>> [tuple(int(v) for v in size_class(n)) for n in (7, 9, 640)]
        [(7, 7), (9, 10), (33, 640)]
    """
    caps = tf.constant(_CAPACITIES, tf.int64)
    n = tf.reshape(tf.cast(elements, tf.int64), [1, 1])
    cls = tf.reshape(tf.raw_ops.LowerBound(sorted_inputs=tf.expand_dims(caps, 0), values=n,
                                           out_type=tf.int32), [])
    return cls, tf.cast(tf.gather(caps, cls), tf.int32)


def sized_broadcast(value: Any | None, shape: Any, dtype: Any, *, group: ProcessGroup,
                    instance: tuple[int, int], timeout: float = 0.0) -> tf.Tensor:
    """`group_broadcast` of a tensor whose shape changes from step to step.

    TensorFlow remembers the shape of each instance key for the life of the job, so the tensor
    travels flat, padded to its size class (`size_class`), on the sized key ``instance``
    (`tfdist.parallel.keys.sized_key`: the key of class 0 and the stride of a class) for its
    class: each key keeps one shape. The source passes
    ``value`` and gets the send back (flat and padded: tie it to the step's outputs); the
    others pass ``shape`` (this step's, a tensor) and ``dtype``, and get the tensor.
    """
    if value is not None:
        flat = tf.reshape(value, [-1])
        elements = tf.size(flat)
    else:
        elements = tf.reduce_prod(tf.cast(shape, tf.int32))
    cls, cap = size_class(elements)
    key = tf.constant(instance[0], tf.int32) + cls * instance[1]
    if value is not None:
        padded = tf.pad(flat, [[0, cap - elements]])
        return group_broadcast(padded, None, dtype, group=group, instance=key, timeout=timeout)
    padded = group_broadcast(None, tf.reshape(cap, [1]), dtype, group=group, instance=key,
                             timeout=timeout)
    return tf.reshape(padded[:elements], shape)


def broadcast_variable(variable: Any, *, group: ProcessGroup, instance: int | None = None,
                       timeout: float = 0.0) -> None:
    """Gives ``variable`` on every member of ``group`` the value it has on group rank 0."""
    if group.size == 1:
        return
    first = group.rank == 0
    value = group_broadcast(tf.convert_to_tensor(variable) if first else None, variable.shape,
                            tf.as_dtype(variable.dtype), group=group, instance=instance,
                            timeout=timeout)
    if not first:
        variable.assign(value)


def all_reduce(x: Any, group: ProcessGroup, op: Reduction = "sum", *,
               instance: int | None = None, timeout: float = 0.0) -> Any:
    """The element-wise ``op`` (``sum``, ``mean`` or ``max``) of ``x`` over ``group``.

    No gradient rule of its own (the mappings, `tfdist.parallel.mappings`, give one).
    """
    if op not in _MERGE:
        raise StrategyConfigError(format_error(
            "Unknown all-reduce.", received=f"op={op!r}", expected=f"one of {tuple(_MERGE)}",
            fix="pass 'sum', 'mean' or 'max'"))
    local = getattr(group, "reduce_locally", None)  # `tfdist.tensor.check`: T shards, 1 process
    if local is not None:
        return local(x, op)
    if group.size == 1:
        return x
    total = collective_ops.all_reduce_v2(
        x, group_size=group.size, group_key=group.key, instance_key=_key(instance, group),
        merge_op=_MERGE[op], final_op="Id", timeout=timeout)
    return total / group.size if op == "mean" else total


def all_reduce_mean(tensors: Sequence[Any], *, group: ProcessGroup, kind: int = REDUCE,
                    phase: int = TRAIN, timeout: float = 0.0) -> list[Any]:
    """The element-wise mean of each tensor over ``group``; tensor ``i`` on the named key
    ``instance_key(kind, 0, i, phase)``."""
    return [all_reduce(t, group, "mean", instance=instance_key(kind, 0, i, phase),
                       timeout=timeout) for i, t in enumerate(tensors)]


def all_gather(x: Any, group: ProcessGroup, axis: int = 0, *, instance: int | None = None,
               timeout: float = 0.0) -> tf.Tensor:
    """The members' ``x`` concatenated along ``axis``, in group-rank order (no gradient rule).

    Example:
        >>> from tfdist.parallel.mesh import Mesh
        >>> all_gather([[1.0, 2.0]], Mesh().group("tensor", 0), axis=1).shape
        TensorShape([1, 2])
    """
    x = tf.convert_to_tensor(x)
    if group.size == 1:
        return x
    order = [axis, *(i for i in range(len(x.shape)) if i != axis)]
    moved = tf.transpose(x, order) if axis else x
    gathered = collective_ops.all_gather_v2(
        moved, group_size=group.size, group_key=group.key, instance_key=_key(instance, group),
        timeout=timeout)
    inverse = [order.index(i) for i in range(len(order))]
    return tf.transpose(gathered, inverse) if axis else gathered


def reduce_scatter(x: Any, group: ProcessGroup, axis: int = 0, *,
                   instance: int | None = None, timeout: float = 0.0) -> tf.Tensor:
    """This member's part (``group.rank``-th of ``group.size`` equal parts along ``axis``) of
    the sum of ``x`` over ``group`` (no gradient rule).

    TensorFlow's collective runtime has no reduce-scatter op, so this is an all-to-all (each
    member sends part ``j`` to member ``j``) and a local sum of the parts received: each
    member sends and receives ``(size - 1) / size`` of ``x``'s bytes, as a ring reduce-scatter
    does (an all-reduce moves twice that). The parts are summed in group-rank order.

    Raises:
        StrategyConfigError: ``x``'s ``axis`` is not a multiple of the group's size.

    Example:
        >>> from tfdist.parallel.mesh import Mesh
        >>> reduce_scatter([[1.0], [2.0]], Mesh().group("data", 0)).shape
        TensorShape([2, 1])
    """
    x = tf.convert_to_tensor(x)
    if group.size == 1:
        return x
    length = x.shape[axis]
    if length is not None and length % group.size:
        raise StrategyConfigError(format_error(
            "reduce_scatter cuts the tensor into one equal part per member.",
            received=f"shape {x.shape.as_list()}, axis={axis}, group of {group.size}",
            expected=f"a length along axis {axis} that is a multiple of {group.size}",
            fix="pad the tensor, or scatter along another axis"))
    order = [axis, *(i for i in range(len(x.shape)) if i != axis)]
    moved = tf.transpose(x, order) if axis else x
    # TensorFlow's all-to-all wants exactly one row per member: each member's part, flat
    part_shape = tf.concat([[tf.shape(moved)[0] // group.size], tf.shape(moved)[1:]], axis=0)
    exchanged = collective_ops.all_to_all_v2(
        tf.reshape(moved, [group.size, -1]), group_size=group.size, group_key=group.key,
        instance_key=_key(instance, group), timeout=timeout)
    total = exchanged[0]
    for rank in range(1, group.size):
        total = total + exchanged[rank]
    total = tf.reshape(total, part_shape)
    total.set_shape([None if length is None else length // group.size, *moved.shape[1:]])
    inverse = [order.index(i) for i in range(len(order))]
    return tf.transpose(total, inverse) if axis else total
