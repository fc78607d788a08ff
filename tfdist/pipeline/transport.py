"""Tensors across a pipeline's cuts, over the substrate's collectives (`tfdist.parallel`).

A cut between stages carries a tuple of tensors (`BoundaryTensor`); `send_boundary` and
`recv_boundary` move them through a `Link` (send/recv in a group of two,
`tfdist.parallel.ops`), each on its named instance key (`tfdist.parallel.keys.instance_key`:
``kind`` `ACTIVATION` forward, `GRADIENT` back, ``index`` the tensor's place in the cut). The
kinds, phases, `Link` and the group collectives are the substrate's; they are named here too,
since every pipeline module speaks of them.

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

@dataclasses.dataclass(frozen=True)
class BoundaryTensor:
    """One tensor alive across a cut between stages (`tfdist.pipeline.partition.crossing`).

    A cut carries a tuple of them: tensor ``i`` travels as index ``i`` of each micro-batch's
    ``ACTIVATION`` transfer, and, when it has a ``gradient``, its gradient comes back as index
    ``i`` of the ``GRADIENT`` transfer.

    Attributes:
        shape: Its shape without the batch dimension.
        dtype: Its dtype name.
        gradient: Whether its gradient goes back: a floating tensor made by a layer (integer
            tensors, masks and the model's inputs travel forward only).

    Example:
        >>> BoundaryTensor((4,), "int32", gradient=False).nbytes
        16
    """

    shape: tuple[int, ...]
    dtype: str
    gradient: bool

    @property
    def nbytes(self) -> int:
        """Bytes per row."""
        size = tf.as_dtype(self.dtype).size
        for d in self.shape:
            size *= int(d)
        return size


def send_boundary(link: Any, tensors: Sequence[Any], boundary: Sequence[BoundaryTensor],
                  kind: int, micro_batch: int = 0, phase: int = TRAIN) -> list[Any]:
    """Sends a cut's tensors (``kind`` ACTIVATION: all; GRADIENT: those with a gradient, a
    None one as zeros); returns the sends, to tie to the step's outputs."""
    sends = []
    for i, (tensor, spec) in enumerate(zip(tensors, boundary, strict=True)):
        if kind == GRADIENT and not spec.gradient:
            continue
        sends.append(link.send(tensor, kind, micro_batch, index=i, phase=phase))
    return sends


def recv_boundary(link: Any, boundary: Sequence[BoundaryTensor], rows: Any, kind: int,
                  micro_batch: int = 0, phase: int = TRAIN) -> list[Any]:
    """Receives what `send_boundary` sends: ``kind`` ACTIVATION, every tensor of the cut;
    GRADIENT, a gradient per tensor that has one, None for the others."""
    received = []
    for i, spec in enumerate(boundary):
        if kind == GRADIENT and not spec.gradient:
            received.append(None)
            continue
        shape = tf.stack([rows, *[int(d) for d in spec.shape]])
        received.append(link.recv(shape, tf.as_dtype(spec.dtype), kind, micro_batch, index=i,
                                  phase=phase))
    return received
