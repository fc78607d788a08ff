"""The Horovod collectives `tfdist.strategies.horovod.HorovodStrategy` reduces and gathers with.

Horovod has no ``tf.distribute`` strategy, so these are the strategy's own: its replica-context
all-reduce, ``reduce``/``gather`` and the broadcast of each variable's initial value. Everything
else in `tfdist.horovod` (optimizer, callbacks, variable broadcasts) is Horovod's own code.

Horovod matches a collective across processes by its *name*: every rank must submit the same name
with the same shape and dtype. Horovod's default names come from TensorFlow tensor names, which
contain Keras layer names (``dense_3/...``), so two ranks that built their models differently
(say rank 0 built an extra reference model first) would wait on each other forever. tfdist names
its collectives by position instead: ``tfdist_<kind>_<n>`` where ``n`` counts the collectives in
the graph being traced (or, in eager mode, in this process). A mismatch then shows up as
Horovod's "mismatched shapes" error rather than as a hang.

Example:
    Under ``horovodrun -np 2``, with rank ``r`` holding ``[r + 1.0]``::

        allreduce([tf.constant([1.0 + hvd.rank()])], op="sum")  # [<tf.Tensor [3.]>] on both
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow as tf

from tfdist.horovod.runtime import hvd, init
from tfdist.options import check_choice

__all__ = [
    "REDUCE_OPS",
    "COMPRESSIONS",
    "check_op",
    "check_compression",
    "allreduce",
    "allgather",
    "broadcast_tensor",
]

REDUCE_OPS = ("average", "sum")
"""Names accepted for ``op``: the mean or the sum over ranks."""

COMPRESSIONS = (None, "none", "fp16")
"""Names accepted for ``compression``: ``"fp16"`` sends float tensors as float16 and casts back."""

_BROADCASTABLE = {tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64, tf.float16,
                  tf.bfloat16, tf.float32, tf.float64, tf.bool}

_graph_counters: weakref.WeakKeyDictionary[Any, Iterator[int]] = weakref.WeakKeyDictionary()
_eager_counter = itertools.count()


def check_op(op: str) -> str:
    """Returns ``op`` if it is one of `REDUCE_OPS`, else raises `StrategyConfigError`.

    Example:
        >>> check_op("sum")
        'sum'
    """
    return check_choice("op", op, REDUCE_OPS, fix="pass op='average' (the default) or op='sum'")


def check_compression(compression: str | None) -> str | None:
    """Returns ``compression`` if it is one of `COMPRESSIONS`, else raises `StrategyConfigError`.

    Example:
        >>> check_compression("fp16")
        'fp16'
    """
    return check_choice("compression", compression, COMPRESSIONS,
                        fix="pass compression='fp16' to halve the bytes sent, or leave it out")


def _name(kind: str) -> str:
    if tf.executing_eagerly():
        return f"tfdist_{kind}_e{next(_eager_counter)}"
    graph = tf.compat.v1.get_default_graph()
    counter = _graph_counters.setdefault(graph, itertools.count())
    return f"tfdist_{kind}_{next(counter)}"


def _hvd_op(op: str | tf.distribute.ReduceOp) -> Any:
    if isinstance(op, tf.distribute.ReduceOp):
        op = "sum" if op == tf.distribute.ReduceOp.SUM else "average"
    return hvd().Sum if check_op(op) == "sum" else hvd().Average


def _densify(value: Any) -> Any:
    return tf.convert_to_tensor(value) if isinstance(value, tf.IndexedSlices) else value


def allreduce(
    values: Sequence[Any],
    *,
    op: str | tf.distribute.ReduceOp = "average",
    compression: str | None = None,
    sparse_as_dense: bool = False,
) -> list[Any]:
    """Reduces each tensor over all ranks in one grouped (fused) Horovod all-reduce.

    Args:
        values: Tensors, ``tf.IndexedSlices`` or None (passed through as None).
        op: ``"average"``, ``"sum"`` or a ``tf.distribute.ReduceOp``.
        compression: None or ``"fp16"`` (float tensors travel as float16).
        sparse_as_dense: Densify ``tf.IndexedSlices`` first (all-reduce instead of all-gather).

    Returns:
        The reduced values, in the order of ``values``.

    Example:
        >>> [float(t) for t in allreduce([tf.constant(2.0), None][:1], op="sum")]  # one process
        [2.0]
    """
    module = init()
    compressor = module.Compression.fp16 if check_compression(compression) == "fp16" else None
    present = [i for i, v in enumerate(values) if v is not None]
    if not present or module.size() == 1:
        # One rank: the sum or average is the value itself. Skipping the collective (as Horovod's
        # own optimizer does) measured 1.5-2.5x faster steps for a small model (tfdist-bench).
        return list(values)
    tensors = [_densify(values[i]) if sparse_as_dense else values[i] for i in present]
    reduced = module.grouped_allreduce(
        tensors, op=_hvd_op(op), compression=compressor or module.Compression.none,
        name=_name("allreduce"), ignore_name_scope=True)
    out = list(values)
    for i, value in zip(present, reduced, strict=True):
        out[i] = value
    return out


def allgather(value: Any, axis: int = 0) -> tf.Tensor:
    """Concatenates ``value`` from every rank, in rank order, along ``axis``.

    Example:
        >>> allgather(tf.constant([[1, 2]]), axis=1).numpy().tolist()  # one process
        [[1, 2]]
    """
    tensor = tf.convert_to_tensor(value)
    perm = None
    if axis != 0:
        perm = list(range(tensor.shape.rank))
        perm[0], perm[axis] = perm[axis], perm[0]
        tensor = tf.transpose(tensor, perm)
    gathered = init().allgather(tensor, name=_name("allgather"), ignore_name_scope=True)
    return gathered if perm is None else tf.transpose(gathered, perm)


def broadcast_tensor(value: Any, root_rank: int = 0, dtype: Any = None) -> Any:
    """Rank ``root_rank``'s value of ``value`` on every rank (dtypes Horovod cannot send: as is).

    Example:
        >>> float(broadcast_tensor(3.0, dtype=tf.float32))  # one process
        3.0
    """
    tensor = tf.convert_to_tensor(value, dtype=dtype)
    if tensor.dtype.base_dtype not in _BROADCASTABLE:
        return tensor
    return init().broadcast(tensor, root_rank, name=_name("broadcast"), ignore_name_scope=True)
