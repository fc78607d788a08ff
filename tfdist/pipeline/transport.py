"""Tensors across a pipeline's cuts, over the substrate's collectives (`tfdist.parallel`).

A cut between stages carries a tuple of tensors (`BoundaryTensor`); `send_boundary` and
`recv_boundary` move them through a `Link` (send/recv in a group of two,
`tfdist.parallel.ops`), each on its named instance key (`tfdist.parallel.keys.instance_key`:
``kind`` `ACTIVATION` forward, `GRADIENT` back, ``index`` the tensor's place in the cut). The
kinds, phases, `Link` and the group collectives are the substrate's; they are named here too,
since every pipeline module speaks of them.

A cut may carry tensors whose shape beyond the batch axis is not fixed by the model (a
KerasHub backbone's ``keras.Input`` has no sequence length): each batch may have its own. The
stages agree on each micro-batch's shapes with the transfer itself: the sender adds one small
vector, the unknown dimensions of every tensor of the cut in order (index `SHAPES_INDEX`), and
the receiver reads it before the tensors. A gradient comes back with the shape of the tensor it
belongs to, which its receiver (the stage that sent that tensor) holds. Such a tensor travels
on a sized key (`Link.send_sized`, `tfdist.parallel.ops.sized_broadcast`): TensorFlow keeps one
shape per instance key for the life of the job.

Example:
    >>> instance_key(GRADIENT, micro_batch=1, index=0)
    33558528
    >>> from tfdist.parallel.mesh import pair_group
    >>> link = Link(pair_group(3, 2))
    >>> link.rank, link.peer, link.group.key
    (3, 2, 1056771)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tfdist.parallel.keys import (  # noqa: F401 - the pipeline's names for the substrate's keys
    ACTIVATION,
    CUSTOM,
    EVALUATE,
    EXIT,
    GRADIENT,
    METRICS,
    PREDICT,
    REDUCE,
    SHARE,
    STOP_VOTE,
    TIED,
    TRAIN,
    WEIGHTS,
    instance_key,
)
from tfdist.parallel.ops import (  # noqa: F401 - as above
    Link,
    all_reduce,
    all_reduce_mean,
    broadcast_variable,
    group_broadcast,
)

__all__ = [
    "SHAPES_INDEX",
    "ACTIVATION",
    "GRADIENT",
    "WEIGHTS",
    "REDUCE",
    "instance_key",
    "Link",
    "BoundaryTensor",
    "send_boundary",
    "recv_boundary",
    "group_broadcast",
    "all_reduce_mean",
]

SHAPES_INDEX = 4094
"""The tensor index of a transfer's unknown dimensions (`send_boundary`); the tensors a cut
carries take indices ``0..n-1``, the carried loss terms 4095 (`tfdist.pipeline.engine`)."""


@dataclasses.dataclass(frozen=True)
class BoundaryTensor:
    """One tensor alive across a cut between stages (`tfdist.pipeline.partition.crossing`).

    A cut carries a tuple of them: tensor ``i`` travels as index ``i`` of each micro-batch's
    ``ACTIVATION`` transfer, and, when it has a ``gradient``, its gradient comes back as index
    ``i`` of the ``GRADIENT`` transfer.

    Attributes:
        shape: Its shape without the batch dimension; None where each batch may have its own
            (a sequence length), agreed with each transfer.
        dtype: Its dtype name.
        gradient: Whether its gradient goes back: a floating tensor made by a layer (integer
            tensors, masks and the model's inputs travel forward only).

    Example:
        >>> BoundaryTensor((4,), "int32", gradient=False).nbytes
        16
        >>> BoundaryTensor((None, 8), "float32", gradient=True).unknown
        (0,)
    """

    shape: tuple[int | None, ...]
    dtype: str
    gradient: bool

    @property
    def nbytes(self) -> int:
        """Bytes per row (an unknown dimension counted as 1)."""
        size = tf.as_dtype(self.dtype).size
        for d in self.shape:
            size *= int(d or 1)
        return size

    @property
    def unknown(self) -> tuple[int, ...]:
        """The axes (without the batch axis) whose length each batch gives."""
        return tuple(i for i, d in enumerate(self.shape) if d is None)


def _unknown_dims(tensors: Sequence[Any], boundary: Sequence[BoundaryTensor]) -> list[Any]:
    """The unknown dimensions of ``tensors``, in the cut's order (the vector a transfer adds)."""
    dims = []
    for tensor, spec in zip(tensors, boundary, strict=True):
        if spec.unknown:
            shape = tf.shape(tensor, out_type=tf.int32)
            dims.extend(shape[1 + axis] for axis in spec.unknown)
    return dims


def _shape(spec: BoundaryTensor, rows: Any, dims: Any) -> Any:
    """The shape to receive ``spec`` with: ``rows``, then each axis's known length or the next
    of ``dims`` (an iterator over the received unknown dimensions)."""
    return tf.stack([rows, *[next(dims) if d is None else int(d) for d in spec.shape]])


def send_boundary(link: Any, tensors: Sequence[Any], boundary: Sequence[BoundaryTensor],
                  kind: int, micro_batch: int = 0, phase: int = TRAIN) -> list[Any]:
    """Sends a cut's tensors (``kind`` ACTIVATION: all, and their unknown dimensions if any,
    on `SHAPES_INDEX`; GRADIENT: those with a gradient, a None one as zeros); returns the
    sends, to tie to the step's outputs."""
    sends = []
    if kind != GRADIENT and any(spec.unknown for spec in boundary):
        dims = tf.stack(_unknown_dims(tensors, boundary))
        sends.append(link.send(dims, kind, micro_batch, index=SHAPES_INDEX, phase=phase))
    for i, (tensor, spec) in enumerate(zip(tensors, boundary, strict=True)):
        if kind == GRADIENT and not spec.gradient:
            continue
        send = link.send_sized if spec.unknown else link.send
        sends.append(send(tensor, kind, micro_batch, index=i, phase=phase))
    return sends


def recv_boundary(link: Any, boundary: Sequence[BoundaryTensor], rows: Any, kind: int,
                  micro_batch: int = 0, phase: int = TRAIN,
                  like: Sequence[Any] | None = None) -> list[Any]:
    """Receives what `send_boundary` sends: ``kind`` ACTIVATION, every tensor of the cut;
    GRADIENT, a gradient per tensor that has one, None for the others.

    Args:
        like: GRADIENT: the tensors whose gradients come back (this stage's outputs), which
            give the shapes a cut leaves unknown. Needed only then.
    """
    count = sum(len(spec.unknown) for spec in boundary)
    if kind == GRADIENT or not count:
        dims = iter(_unknown_dims(like, boundary) if count and like is not None else ())
    else:
        dims = iter(tf.unstack(link.recv(tf.constant([count]), tf.int32, kind, micro_batch,
                                         index=SHAPES_INDEX, phase=phase), num=count))
    received = []
    for i, spec in enumerate(boundary):
        shape = _shape(spec, rows, dims)
        if kind == GRADIENT and not spec.gradient:
            received.append(None)
            continue
        recv = link.recv_sized if spec.unknown else link.recv
        received.append(recv(shape, tf.as_dtype(spec.dtype), kind, micro_batch, index=i,
                             phase=phase))
    return received
