"""Initializers for a shard: draw the whole weight (so variance-scaling initializers see the
whole layer's fans), keep this shard's slice. One layer's whole weight exists at a time, while
it is initialised.

Example:
    >>> init = ShardInitializer("ones", (2, 4), axis=1, index=1, parts=2)
    >>> tuple(init((2, 2), "float32").shape)
    (2, 2)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

__all__ = ["ShardInitializer", "HeadsInitializer"]


def _slice(whole: Any, axis: int, index: int, parts: int) -> Any:
    size = whole.shape[axis] // parts
    return tf.gather(whole, tf.range(index * size, (index + 1) * size), axis=axis)


class ShardInitializer(keras.initializers.Initializer):
    """Shard ``index`` of ``parts`` along ``axis`` of ``base``'s draw of ``full_shape``."""

    def __init__(self, base: Any, full_shape: Sequence[int], axis: int, index: int,
                 parts: int) -> None:
        self.base = keras.initializers.get(base)
        self.full_shape, self.axis = tuple(int(d) for d in full_shape), int(axis)
        self.index, self.parts = int(index), int(parts)

    def __call__(self, shape: Any, dtype: Any = None) -> Any:
        whole = tf.convert_to_tensor(self.base(self.full_shape, dtype=dtype))
        return _slice(whole, self.axis, self.index, self.parts)

    def get_config(self) -> dict[str, Any]:
        return {"base": keras.initializers.serialize(self.base),
                "full_shape": list(self.full_shape), "axis": self.axis, "index": self.index,
                "parts": self.parts}


class HeadsInitializer(keras.initializers.Initializer):
    """For every weight of a heads-split attention: the heads axis is 1 of the query/key/value
    kernels ``(d, h, k)``, 0 of their biases ``(h, k)`` and of the output kernel
    ``(h, k, d)``; the output bias ``(d,)`` whole."""

    def __init__(self, base: Any, heads: int, key_dim: int, index: int, parts: int) -> None:
        self.base = keras.initializers.get(base)
        self.heads, self.key_dim = int(heads), int(key_dim)
        self.index, self.parts = int(index), int(parts)

    def __call__(self, shape: Any, dtype: Any = None) -> Any:
        shape = tuple(int(d) for d in shape)
        if len(shape) == 1:  # the output bias: replicated
            return self.base(shape, dtype=dtype)
        local = self.heads // self.parts
        axis = 1 if len(shape) == 3 and shape[1] == local and shape[2] == self.key_dim else 0
        whole = list(shape)
        whole[axis] = self.heads
        return ShardInitializer(self.base, whole, axis, self.index, self.parts)(shape, dtype)

    def get_config(self) -> dict[str, Any]:
        return {"base": keras.initializers.serialize(self.base), "heads": self.heads,
                "key_dim": self.key_dim, "index": self.index, "parts": self.parts}
