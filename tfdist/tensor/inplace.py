"""A built model's layers made into this process's shard, in place: the user's block classes
and their ``call`` stay; each split leaf layer keeps only its slice of its variables and its
``call`` is wrapped with Megatron's mappings (`tfdist.parallel.mappings`).

* ``column`` (a query/key/value projection by heads, a feed-forward up or gate): the input
  through `copy_to_group`, then the layer's own ``call`` on its slice;
* ``row`` (an attention output projection by heads, a feed-forward down): the partial
  product summed over the group (`reduce_from_group`), then the whole bias and activation;
* ``hidden`` (a query/key/value projection split by its hidden units, as KerasHub's layout maps
  ask: `tfdist.kdist.layout`): the shard's slice of the input times its rows of the kernel, the
  group's sum (forward and backward: every shard's heads read all of it), then the shard's heads;
* ``vocab`` / ``tied`` (an ``Embedding`` or ``ReversibleEmbedding``): tokens outside the
  shard's rows look up zeros and the group sums the lookups; ``reverse=True`` gives the
  shard's vocabulary columns of the logits;
* an attention's head counts (``num_query_heads``, ``_num_heads``, ...) become the shard's, so
  its own ``call`` reshapes and repeats for the heads it holds; key/value projections kept
  whole (T a multiple of the key/value heads) give the shard its query heads' key/value head.

`shard_in_place` is what `tfdist.strategies.tensor.TensorStrategy` does to a KerasHub model,
and what `tfdist.tensor.check` does to T copies of a block to check it before training.

Example:
    >>> import keras, numpy as np
    >>> from tfdist.parallel.mesh import Mesh
    >>> from tfdist.tensor.nested import plan_nested
    >>> class Block(keras.layers.Layer):
    ...     def __init__(self, **kwargs):
    ...         super().__init__(**kwargs)
    ...         self.up, self.down = keras.layers.Dense(8), keras.layers.Dense(2)
    ...     def call(self, x):
    ...         return self.down(self.up(x))
    >>> inputs = keras.Input((2,))
    >>> model = keras.Model(inputs, Block(name="b")(inputs))
    >>> plan, units = plan_nested(model, 1)
    >>> shard_in_place(model, plan, units, Mesh().group("tensor", 0))
    >>> model(np.ones((1, 2), "float32")).shape
    TensorShape([1, 2])
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfdist.parallel import mappings
from tfdist.parallel.mesh import ProcessGroup
from tfdist.tensor.nested import Unit, layer_at
from tfdist.tensor.plan import LayerSplit, TensorPlan

__all__ = ["shard_in_place", "swap_variable", "HEAD_COUNTS", "KV_COUNTS"]

HEAD_COUNTS = ("_num_heads", "num_heads", "num_query_heads", "_num_query_heads")
"""Attributes of an attention layer that count its query heads."""
KV_COUNTS = ("num_key_value_heads", "_num_key_value_heads")
"""Attributes that count its key/value heads."""


def swap_variable(layer: Any, old: Any, value: np.ndarray) -> Any:
    """Replaces ``layer``'s variable ``old`` by a new one holding ``value`` (same path, dtype,
    trainability), wherever ``layer`` keeps it."""
    new = keras.Variable(value, dtype=old.dtype, trainable=old.trainable,
                         name=old.name.split(":")[0])
    new._path = old.path  # the same path: plans, checkpoints and the optimizer's slots read it
    for key, held in list(vars(layer).items()):
        if held is old:
            object.__setattr__(layer, key, new)
        elif isinstance(held, list):  # Keras's variable lists, TensorFlow's dependency list
            held[:] = [_swapped(v, old, new) for v in held]
        elif isinstance(held, dict):  # TensorFlow's dependencies by name
            for name, value in list(held.items()):
                if value is old:  # dict's own: a Keras TrackedDict would track it anew
                    dict.__setitem__(held, name, new)
    return new


def _swapped(item: Any, old: Any, new: Any) -> Any:
    """``item`` with ``old`` replaced by ``new``: the variable itself, or TensorFlow's
    checkpoint reference to it (``TrackableReference(name, ref)``), which otherwise kept the
    whole unsliced variable alive beside its slice (a GPT-2 shard held both: 58 MB more)."""
    if item is old:
        return new
    if getattr(item, "ref", None) is old and hasattr(item, "name"):
        return type(item)(item.name, new)
    return item


def _slice_variables(layer: Any, entry: LayerSplit, group: ProcessGroup) -> None:
    for variable, weight in zip(list(layer.weights), entry.weights, strict=True):
        if weight.axis is None or group.size == 1:
            continue
        size = weight.shape[weight.axis] // group.size
        index = [slice(None)] * len(weight.shape)
        index[weight.axis] = slice(group.rank * size, (group.rank + 1) * size)
        swap_variable(layer, variable, np.asarray(variable.numpy())[tuple(index)])


def _column(layer: Any, group: ProcessGroup, timeout: float) -> None:
    call = layer.call

    def column_call(inputs: Any, *args: Any, **kwargs: Any) -> Any:
        return call(mappings.copy_to_group(inputs, group, timeout), *args, **kwargs)

    layer.call = column_call


def _row(layer: Any, group: ProcessGroup, timeout: float) -> None:
    equation = getattr(layer, "equation", None)

    def row_call(inputs: Any, training: Any = None) -> Any:
        if equation is None:
            x = keras.ops.matmul(inputs, layer.kernel)
        else:
            x = keras.ops.einsum(equation, inputs, layer.kernel)
        x = mappings.reduce_from_group(x, group, timeout)
        if layer.bias is not None:
            x = keras.ops.add(x, layer.bias)
        return layer.activation(x) if layer.activation is not None else x

    layer.call = row_call
    layer.input_spec = None  # a Dense checks its input's width: the shard's is 1/T of it


def _hidden(layer: Any, group: ProcessGroup, timeout: float) -> None:
    """A projection ``...m,m..->...h.`` split on its input units ``m``: partial products summed
    over the group, bias and activation once, then this shard's heads (the output's axis -2)."""
    first, kernel_letters = layer.equation.split("->")[0].split(",")
    axis = kernel_letters.index(first[-1])

    def hidden_call(inputs: Any, training: Any = None) -> Any:
        width = int(layer.kernel.shape[axis])
        x = mappings.copy_to_group(inputs, group, timeout)[
            ..., group.rank * width:(group.rank + 1) * width]
        out = mappings.reduce_from_group(keras.ops.einsum(layer.equation, x, layer.kernel),
                                         group, timeout)
        if layer.bias is not None:
            out = keras.ops.add(out, layer.bias)
        if layer.activation is not None:
            out = layer.activation(out)
        out = mappings.copy_to_group(out, group, timeout)
        heads = int(out.shape[-2]) // group.size
        return out[..., group.rank * heads:(group.rank + 1) * heads, :]

    layer.call = hidden_call
    layer.input_spec = None


def _embedding(layer: Any, group: ProcessGroup, timeout: float) -> None:
    rows = int(layer.embeddings.shape[0])
    start = group.rank * rows

    def lookup(inputs: Any) -> Any:
        ids = tf.cast(inputs, tf.int32) - start
        held = tf.logical_and(ids >= 0, ids < rows)
        found = tf.gather(layer.embeddings, tf.where(held, ids, tf.zeros_like(ids)))
        found = found * tf.cast(held, found.dtype)[..., None]
        return mappings.reduce_from_group(tf.cast(found, layer.compute_dtype), group,
                                             timeout)

    def logits(inputs: Any) -> Any:
        hidden = mappings.copy_to_group(inputs, group, timeout)
        tied = getattr(layer, "tie_weights", True)
        kernel = keras.ops.transpose(layer.embeddings) if tied else layer.reverse_embeddings
        reverse_dtype = getattr(layer, "reverse_dtype", None)
        if reverse_dtype is not None:
            hidden, kernel = (keras.ops.cast(t, reverse_dtype) for t in (hidden, kernel))
        out = keras.ops.matmul(hidden, kernel)
        cap = getattr(layer, "logit_soft_cap", None)
        return out if cap is None else keras.ops.multiply(
            keras.ops.tanh(keras.ops.divide(out, cap)), cap)

    def embedding_call(inputs: Any, reverse: bool = False) -> Any:
        return logits(inputs) if reverse else lookup(inputs)

    layer.call = embedding_call


def _whole_key_value(layer: Any, unit: Unit, group: ProcessGroup, timeout: float) -> None:
    """A key/value projection whole on every shard: its output's gradient summed over the
    group (each shard's heads use part of it), then the one head this shard's queries read."""
    call = layer.call
    head = group.rank * unit.kv_heads // group.size

    def key_value_call(inputs: Any, *args: Any, **kwargs: Any) -> Any:
        out = mappings.copy_to_group(call(inputs, *args, **kwargs), group, timeout)
        return out[..., head:head + 1, :]

    layer.call = key_value_call


def _local_heads(attention: Any, unit: Unit, shards: int) -> None:
    state = vars(attention)
    for key in HEAD_COUNTS:
        if isinstance(state.get(key), int):
            object.__setattr__(attention, key, unit.heads // shards)
    for key in KV_COUNTS:
        if isinstance(state.get(key), int):
            object.__setattr__(attention, key,
                               1 if unit.kv_whole else unit.kv_heads // shards)
    if unit.kv_whole and isinstance(state.get("num_key_value_groups"), int):
        object.__setattr__(attention, "num_key_value_groups", unit.heads // shards)


_WRAPS = {"column": _column, "row": _row, "vocab": _embedding, "tied": _embedding,
          "hidden": _hidden}


def shard_in_place(model: Any, plan: TensorPlan, units: tuple[Unit, ...],
                   group: ProcessGroup, timeout: float | None = None) -> None:
    """Makes ``model`` (built, holding the whole weights) this process's shard of ``plan``.

    Args:
        model: The model (or a block) whose layers the plan's paths name.
        plan: `tfdist.tensor.nested.plan_nested`'s plan.
        units: Its units.
        group: The tensor group (rank: which slice this process keeps).
        timeout: The collectives' deadline when run eagerly.
    """
    timeout = mappings.DEFAULT_TIMEOUT if timeout is None else float(timeout)
    if group.size == 1:
        return
    for entry in plan.layers:
        if entry.split:
            layer = layer_at(model, entry.name)
            _slice_variables(layer, entry, group)
            _WRAPS[entry.kind](layer, group, timeout)
    for unit in units:
        if unit.kind != "attention":
            continue
        _local_heads(layer_at(model, unit.owner), unit, group.size)
        if unit.kv_whole:
            for path in unit.paths[1:3]:
                _whole_key_value(layer_at(model, path), unit, group, timeout)
