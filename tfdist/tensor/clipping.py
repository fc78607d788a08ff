"""Gradient-norm clipping across shards, as Keras 3's optimizer clips the whole model's.

A split variable's gradient is spread over the tensor group, so its squared norm is summed over
the group; a replicated one's is counted once (every shard has the same). The scale is then
Keras's: ``clip / max(norm, clip)``, for each variable (``clipnorm``) or for all at once
(``global_clipnorm``). Row-slice gradients (an ``Embedding``'s) count their slices' values, as
Keras 3 does; global clipping makes them dense, as Keras 3's does, per-variable clipping keeps
them row slices, as ``tf.clip_by_norm`` does.

Example:
    >>> import tensorflow as tf
    >>> from tfdist.parallel.mesh import Mesh
    >>> grads = [tf.constant([3.0, 4.0])]
    >>> [g.numpy().tolist() for g in clip_global(grads, [False], 1.0, Mesh().group("tensor", 0))]
    [[0.6000000238418579, 0.800000011920929]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tfdist.parallel.mappings import all_reduce_sum
from tfdist.parallel.mesh import ProcessGroup
from tfdist.parallel.ops import DEFAULT_TIMEOUT

__all__ = ["clip_global", "clip_each"]


def _values(g: Any) -> Any:
    return g.values if isinstance(g, tf.IndexedSlices) else g


def _scale(g: Any, scale: Any) -> Any:
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(g.values * scale, g.indices, g.dense_shape)
    return g * scale


def _factor(norm: Any, clip: float) -> Any:
    return clip * tf.minimum(1.0 / norm, 1.0 / clip) + (norm - norm)


def clip_global(gradients: Sequence[Any], split: Sequence[bool], clip: float,
                group: ProcessGroup, timeout: float = DEFAULT_TIMEOUT) -> list[Any]:
    """``gradients`` scaled so that the whole model's global norm is at most ``clip``."""
    present = [(g, is_split) for g, is_split in zip(gradients, split, strict=True)
               if g is not None]
    squares = [(tf.reduce_sum(tf.square(_values(g))), is_split) for g, is_split in present]
    whole = [s for s, is_split in squares if not is_split]
    shares = [s for s, is_split in squares if is_split]
    total = tf.add_n(whole) if whole else tf.constant(0.0)
    if shares:
        total += all_reduce_sum(tf.add_n(shares), group, timeout)
    factor = _factor(tf.sqrt(total), clip)
    # ``g * factor`` as Keras writes it: row slices become a dense gradient there, which
    # changes how Adam updates them, so they must here too.
    return [None if g is None else g * factor for g in gradients]


def clip_each(gradients: Sequence[Any], split: Sequence[bool], clip: float,
              group: ProcessGroup, timeout: float = DEFAULT_TIMEOUT) -> list[Any]:
    """Each whole variable's gradient scaled so that its norm is at most ``clip``."""
    clipped = []
    for g, is_split in zip(gradients, split, strict=True):
        if g is None:
            clipped.append(g)
            continue
        square = tf.reduce_sum(tf.square(_values(g)))
        if is_split:
            square = all_reduce_sum(square, group, timeout)
        norm = tf.sqrt(square)
        clipped.append(_scale(g, clip / tf.maximum(norm, clip)))
    return clipped
