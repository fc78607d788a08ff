"""Keras 3 layers that hold one shard of a standard layer and talk to their tensor group.

Each subclasses the Keras layer it splits, so it creates its weights in the same order and
under the same names, with the shard's shape (Megatron-LM's ``tensor_parallel/layers.py``):

* `ColumnDense`: a ``Dense`` split by output columns (its input through `copy_to_group`); its
  output is this shard's columns. Also the vocabulary-split output projection, whose shards
  go straight into `tfdist.tensor.loss.vocab_parallel_cross_entropy`.
* `RowDense`: a ``Dense`` split by input rows: partial products summed over the group
  (`reduce_from_group`), then the (replicated) bias and the activation.
* `VocabEmbedding`: an ``Embedding`` split by vocabulary rows: each shard looks up the tokens
  it holds (zeros for the others) and the group sums the lookups.
* `TiedVocabEmbedding`: a tied embedding (``ReversibleEmbedding``, `tfdist.tensor.tied`) split
  by vocabulary rows: ``layer(ids)`` as `VocabEmbedding`, ``layer(hidden, reverse=True)`` this
  shard's vocabulary columns of the logits (the hidden's gradient summed over the group); the
  two uses' gradients add up in the one shard of the matrix. With ``whole_logits`` set (a
  pipeline's stages, `tfdist.tensor.stages`), the logits are gathered whole over the group.
* `HeadsAttention`: a ``MultiHeadAttention`` with ``H / T`` heads and its rows of the output
  projection, summed over the group, then the (replicated) output bias.

The group and timeout are not part of a layer's config: a saved model holds the whole layers
(`tfdist.tensor.build.assemble`), never these.

Example:
    >>> import numpy as np
    >>> from tfdist.parallel.mesh import Mesh
    >>> layer = RowDense(2, group=Mesh().group("tensor", 0), kernel_initializer="ones")
    >>> layer(np.ones((1, 3), "float32")).numpy().tolist()
    [[3.0, 3.0]]
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tfdist.parallel.mappings import copy_to_group, gather_from_group, reduce_from_group
from tfdist.parallel.mesh import ProcessGroup
from tfdist.parallel.ops import DEFAULT_TIMEOUT

__all__ = ["ColumnDense", "RowDense", "VocabEmbedding", "TiedVocabEmbedding", "HeadsAttention"]


class _Grouped:
    """The tensor group and the collectives' timeout of a split layer."""

    group: ProcessGroup
    timeout: float

    def _set_group(self, group: ProcessGroup, timeout: float | None) -> None:
        self.group = group
        self.timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)


class ColumnDense(_Grouped, keras.layers.Dense):
    """``Dense`` with this shard's ``units`` output columns; the input's gradient is summed
    over the group."""

    def __init__(self, units: int, *, group: ProcessGroup, timeout: float | None = None,
                 **kwargs: Any) -> None:
        super().__init__(units, **kwargs)
        self._set_group(group, timeout)

    def call(self, inputs: Any, training: Any = None) -> Any:
        return super().call(copy_to_group(inputs, self.group, self.timeout))


class RowDense(_Grouped, keras.layers.Dense):
    """``Dense`` on this shard's input rows: partial products summed over the group, then the
    bias (the same on every shard) and the activation."""

    def __init__(self, units: int, *, group: ProcessGroup, timeout: float | None = None,
                 **kwargs: Any) -> None:
        super().__init__(units, **kwargs)
        self._set_group(group, timeout)

    def call(self, inputs: Any, training: Any = None) -> Any:
        x = reduce_from_group(keras.ops.matmul(inputs, self.kernel), self.group, self.timeout)
        if self.bias is not None:
            x = keras.ops.add(x, self.bias)
        return self.activation(x) if self.activation is not None else x


class VocabEmbedding(_Grouped, keras.layers.Embedding):
    """``Embedding`` rows ``[start, start + input_dim)`` of the vocabulary; tokens outside
    look up zeros, and the group sums the lookups."""

    def __init__(self, input_dim: int, output_dim: int, *, start: int, group: ProcessGroup,
                 timeout: float | None = None, **kwargs: Any) -> None:
        super().__init__(input_dim, output_dim, **kwargs)
        self.start = int(start)
        self._set_group(group, timeout)

    def call(self, inputs: Any) -> Any:
        ids = tf.cast(inputs, tf.int32) - self.start
        held = tf.logical_and(ids >= 0, ids < self.input_dim)
        rows = tf.gather(self.embeddings, tf.where(held, ids, tf.zeros_like(ids)))
        rows = rows * tf.cast(held, rows.dtype)[..., None]
        return reduce_from_group(tf.cast(rows, self.compute_dtype), self.group, self.timeout)


class TiedVocabEmbedding(VocabEmbedding):
    """A tied embedding's rows ``[start, start + input_dim)``: the lookup of `VocabEmbedding`,
    and with ``reverse=True`` the logits of those vocabulary columns (``hidden @ rows^T``,
    then KerasHub's ``logit_soft_cap`` if set), for the vocab-parallel cross-entropy; with
    ``whole_logits``, every column's logits (the shards' gathered, in rank order)."""

    whole_logits = False

    def __init__(self, input_dim: int, output_dim: int, *, start: int, group: ProcessGroup,
                 timeout: float | None = None, logit_soft_cap: float | None = None,
                 reverse_dtype: Any = None, **kwargs: Any) -> None:
        super().__init__(input_dim, output_dim, start=start, group=group, timeout=timeout,
                         **kwargs)
        self.logit_soft_cap, self.reverse_dtype = logit_soft_cap, reverse_dtype

    def call(self, inputs: Any, reverse: bool = False) -> Any:
        if not reverse:
            return super().call(inputs)
        hidden = copy_to_group(inputs, self.group, self.timeout)
        kernel = keras.ops.transpose(self.embeddings)
        if self.reverse_dtype is not None:
            hidden, kernel = (keras.ops.cast(t, self.reverse_dtype) for t in (hidden, kernel))
        logits = keras.ops.matmul(hidden, kernel)
        if self.logit_soft_cap is not None:
            cap = self.logit_soft_cap
            logits = keras.ops.multiply(keras.ops.tanh(keras.ops.divide(logits, cap)), cap)
        if self.whole_logits:
            return gather_from_group(logits, self.group, self.timeout)
        return logits

    def compute_output_spec(self, inputs: Any, reverse: bool = False) -> Any:
        if not reverse:
            return super().compute_output_spec(inputs)
        columns = self.input_dim * (self.group.size if self.whole_logits else 1)
        return keras.KerasTensor((*inputs.shape[:-1], columns),
                                 dtype=self.reverse_dtype or self.compute_dtype)


class HeadsAttention(_Grouped, keras.layers.MultiHeadAttention):
    """``MultiHeadAttention`` with this shard's ``num_heads`` heads: query/key/value columns
    and output-projection rows of those heads; the projections are summed over the group, then
    the output bias (the same on every shard) is added."""

    def __init__(self, num_heads: int, key_dim: int, *, group: ProcessGroup,
                 timeout: float | None = None, **kwargs: Any) -> None:
        super().__init__(num_heads, key_dim, **kwargs)
        self._set_group(group, timeout)
        self._reduced_bias = self._use_bias

    def build(self, query_shape: Any, value_shape: Any, key_shape: Any = None) -> None:
        super().build(query_shape, value_shape, key_shape)
        self.output_bias = None
        if self._reduced_bias:  # a sublayer after the others: the whole layer's weight order
            self.output_bias = _Bias(self._bias_initializer, self._bias_regularizer,
                                     self._bias_constraint, name="attention_output_bias",
                                     dtype=self.dtype_policy)
            self.output_bias.build((int(query_shape[-1]),))

    def _make_output_dense(self, query_shape: Any, common_kwargs: Any, name: Any = None) -> Any:
        use_bias, self._use_bias = self._use_bias, False  # the bias is added after the sum
        try:
            return super()._make_output_dense(query_shape, common_kwargs, name)
        finally:
            self._use_bias = use_bias

    def call(self, query: Any, value: Any, key: Any = None, **kwargs: Any) -> Any:
        same_value, same_key = value is query, key is None or key is query
        query = copy_to_group(query, self.group, self.timeout)
        value = query if same_value else copy_to_group(value, self.group, self.timeout)
        key = None if key is None else (
            query if same_key else copy_to_group(key, self.group, self.timeout))
        if kwargs.get("return_attention_scores"):
            output, scores = super().call(query, value, key, **kwargs)
            return self._finish(output), scores
        return self._finish(super().call(query, value, key, **kwargs))

    def _finish(self, output: Any) -> Any:
        output = reduce_from_group(output, self.group, self.timeout)
        return output if self.output_bias is None else self.output_bias(output)


class _Bias(keras.layers.Layer):
    """Adds a bias vector (the attention output's, after the group's sum)."""

    def __init__(self, initializer: Any, regularizer: Any, constraint: Any,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._init = (initializer, regularizer, constraint)

    def build(self, shape: Any) -> None:
        initializer, regularizer, constraint = self._init
        self.bias = self.add_weight(name="bias", shape=(shape[-1],), initializer=initializer,
                                    regularizer=regularizer, constraint=constraint)

    def call(self, inputs: Any) -> Any:
        return keras.ops.add(inputs, self.bias)
