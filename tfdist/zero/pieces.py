"""A process's pieces of gradients, shared by the data-parallel engine (`tfdist.zero.engine`)
and ZeRO on the pipeline's and tensor's data axis (`tfdist.zero.data_axis`): the buffer a
reduce-scatter takes (each owner's pieces of the dense gradients laid end to end, padded to the
longest) and the pieces taken back out of its result, or out of gathered row slices."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import tensorflow as tf

from tfdist.zero.partition import Piece, ZeroPartition


def piece_rows(value: Any, piece: Piece, shape: Sequence[int]) -> Any:
    """A piece's rows of a whole tensor (a scalar is its own one row)."""
    return value if not shape else value[piece.start:piece.stop]


def own_slices(values: Any, indices: Any, piece: Piece, shape: Sequence[int]
               ) -> tf.IndexedSlices:
    """The row slices of ``piece``'s rows among gathered ``values``/``indices``, their indices
    counted from the piece's first row."""
    keep = tf.logical_and(indices >= piece.start, indices < piece.stop)
    return tf.IndexedSlices(tf.boolean_mask(values, keep),
                            tf.boolean_mask(indices, keep) - piece.start,
                            tf.constant([piece.stop - piece.start, *shape[1:]]))


def owner_buffer(gradients: Sequence[Any] | Mapping[int, Any], plan: ZeroPartition,
                 dense: Collection[int], size: int, dtype: Any) -> tf.Tensor | None:
    """``[size, longest]``: row d holds owner d's pieces of the ``dense`` gradients, flat and
    padded to the longest row, made in one copy; None where no owner has any (every process
    knows the same shapes: all skip, or none; TensorFlow's all-to-all crashes the process on an
    empty buffer)."""
    owned = [[p for p in plan.of_owner(d) if p.variable in dense] for d in range(size)]
    longest = max(sum(p.size for p in pieces) for pieces in owned)
    if not longest:
        return None
    flat = []
    for pieces in owned:
        flat += [tf.reshape(piece_rows(gradients[p.variable], p, plan.shapes[p.variable]), [-1])
                 for p in pieces]
        flat.append(tf.zeros([longest - sum(p.size for p in pieces)], dtype))
    return tf.reshape(tf.concat(flat, 0), [size, longest])


def take_pieces(mine: Sequence[Piece], plan: ZeroPartition, summed: Any, dense: Collection[int],
                gathered: Mapping[int, tuple[Any, Any]], numbers: Collection[int]
                ) -> list[Any]:
    """This process's pieces (``mine``) of the weights in ``numbers``: a dense one's rows out
    of ``summed`` (its owner row of `owner_buffer`, reduced), a sparse one's row slices out of
    its ``gathered`` values and indices, None for a weight without a gradient."""
    out, offset = [], 0
    for piece in mine:
        if piece.variable not in numbers:
            continue
        shape = plan.shapes[piece.variable]
        if piece.variable in dense:
            part_shape = [piece.stop - piece.start, *shape[1:]] if shape else []
            out.append(tf.reshape(summed[offset:offset + piece.size], part_shape))
            offset += piece.size
        elif piece.variable in gathered:
            out.append(own_slices(*gathered[piece.variable], piece, shape))
        else:
            out.append(None)
    return out


def gradient_values(gradient: Any) -> Any:
    """A gradient's values: an ``IndexedSlices``' rows, or the dense tensor itself."""
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient
