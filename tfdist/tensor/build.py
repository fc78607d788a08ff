"""This process's shard of a model, built from the layers' configs; and the whole model back.

`build_shard` clones a model (built, or described without weights by
`tfdist.compat.models.abstract_build`) layer by layer: each layer the plan splits
becomes its split class (`tfdist.tensor.layers`) made from the layer's config with the shard's
sizes, everything else a fresh copy of itself. Only the shard's variables are created.
`shard_weights` slices a whole model's weights for one shard; `gather_weights` concatenates
the group's shards (a collective); `assemble` makes the whole model again, for saving.

Example:
    >>> import keras
    >>> from tfdist.parallel.mesh import Mesh
    >>> from tfdist.tensor.rules import plan_model
    >>> inputs = keras.Input((8,))
    >>> model = keras.Model(inputs, keras.layers.Dense(2, name="down")(
    ...     keras.layers.Dense(4, name="up")(inputs)))
    >>> plan = plan_model(model, shards=1)
    >>> shard = build_shard(model, plan, Mesh().group("tensor", 0))
    >>> [tuple(w.shape) for w in shard.weights]
    [(8, 4), (4,), (4, 2), (2,)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

from tfdist.parallel.mappings import gather_axis
from tfdist.parallel.mesh import ProcessGroup
from tfdist.tensor import layers as split
from tfdist.tensor.initializers import HeadsInitializer, ShardInitializer
from tfdist.tensor.nested import entry_variables, layer_at
from tfdist.tensor.plan import LayerSplit, TensorPlan

__all__ = ["build_shard", "split_layer", "piece", "shard_weights", "gather_weights", "assemble",
           "vocab_start"]


def vocab_start(plan: TensorPlan, group: ProcessGroup) -> int:
    """The first vocabulary column of this shard's output logits (0 without an output split)."""
    vocabulary = plan.vocabulary
    return 0 if vocabulary is None else group.rank * vocabulary // plan.shards


def _sharded_init(config: dict[str, Any], key: str, shape: Sequence[int], axis: int,
                  group: ProcessGroup) -> None:
    config[key] = ShardInitializer(config[key], shape, axis, group.rank, group.size)


def split_layer(layer: Any, plan: LayerSplit, group: ProcessGroup,
                 timeout: float | None) -> Any:
    """This shard of ``layer`` (built or not) as its split class, made from its config with the
    shard's sizes; its split weights' initializers draw the whole weight and slice it."""
    config = layer.get_config()
    shards = group.size
    weights = {w.name.split("/")[-1].split(":")[0]: w for w in plan.weights}
    kind = plan.kind
    if kind in ("column", "output", "row"):
        for key, leaf in (("kernel_initializer", "kernel"), ("bias_initializer", "bias")):
            weight = weights.get(leaf)
            if weight is not None and weight.axis is not None:
                _sharded_init(config, key, weight.shape, weight.axis, group)
        if kind == "row":
            return split.RowDense(group=group, timeout=timeout, **config)
        config["units"] //= shards
        return split.ColumnDense(group=group, timeout=timeout, **config)
    if kind in ("vocab", "tied"):
        _sharded_init(config, "embeddings_initializer", weights["embeddings"].shape, 0, group)
        rows = config.pop("input_dim") // shards
        cls = split.VocabEmbedding
        if kind == "tied":
            config.pop("tie_weights", None)
            cls = split.TiedVocabEmbedding
        return cls(rows, config.pop("output_dim"), start=group.rank * rows, group=group,
                   timeout=timeout, **config)
    heads, key_dim = config.pop("num_heads"), config.pop("key_dim")
    for key in ("kernel_initializer", "bias_initializer"):
        config[key] = HeadsInitializer(config[key], heads, key_dim, group.rank, group.size)
    return split.HeadsAttention(heads // shards, key_dim, group=group, timeout=timeout,
                                **config)


def build_shard(model: Any, plan: TensorPlan, group: ProcessGroup,
                timeout: float | None = None, cls: type | None = None) -> Any:
    """This shard of ``model`` (only its variables are created), as ``cls`` (a functional
    ``keras.Model`` subclass; default ``keras.Model``)."""
    kinds = {layer.name: layer for layer in plan.layers}

    def clone(layer: Any) -> Any:
        found = kinds.get(layer.name)
        if found is None or not found.split or group.size == 1:
            return layer.__class__.from_config(layer.get_config())
        return split_layer(layer, found, group, timeout)

    cloned = keras.models.clone_model(model, clone_function=clone)
    return (cls or keras.Model)(inputs=cloned.inputs, outputs=cloned.outputs, name=model.name)


def piece(value: np.ndarray, axis: int | None, index: int, parts: int) -> np.ndarray:
    """Part ``index`` of ``parts`` of ``value`` along ``axis`` (None: ``value`` itself).

    Example:
        >>> piece(np.arange(4), 0, 1, 2).tolist()
        [2, 3]
    """
    if axis is None:
        return value
    size = value.shape[axis] // parts
    return np.take(value, range(index * size, (index + 1) * size), axis=axis)


def shard_weights(whole: Any, plan: TensorPlan, index: int) -> dict[str, list[np.ndarray]]:
    """Shard ``index``'s weights of each layer, sliced from the built ``whole`` model."""
    return {layer.name: [piece(np.asarray(v), w.axis, index, plan.shards)
                         for v, w in zip(whole.get_layer(layer.name).get_weights(),
                                         layer.weights, strict=True)]
            for layer in plan.layers if layer.weights}


def set_layer_weights(model: Any, weights: dict[str, list[np.ndarray]]) -> None:
    """Each named layer's weights (a name may be a path into nested layers: ``a/b``)."""
    for name, values in weights.items():
        layer_at(model, name).set_weights(values)


def gather_weights(shard: Any, plan: TensorPlan, group: ProcessGroup,
                   timeout: float) -> dict[str, list[np.ndarray]]:
    """Every layer's whole weights, its split ones gathered over ``group`` (a collective that
    every member calls)."""
    gathered = {}
    for layer in plan.layers:
        if not layer.weights:
            continue
        values = [v.numpy() for v in entry_variables(shard, layer)]
        gathered[layer.name] = [
            value if w.axis is None or group.size == 1
            else gather_axis(value, w.axis, group, timeout).numpy()
            for value, w in zip(values, layer.weights, strict=True)]
    return gathered


def assemble(model: Any, weights: dict[str, list[np.ndarray]]) -> Any:
    """A whole copy of ``model`` (fresh layers from its configs) holding ``weights``."""
    whole = keras.models.clone_model(model)
    set_layer_weights(whole, weights)
    return whole
