"""Which layer is split how, as data: `LayerSplit` per layer and the whole `TensorPlan`.

A plan is what `tfdist.tensor.rules.plan_model` decides for a model and ``T`` shards; the
strategy builds the shards from it, slices and gathers weights with it, and prints it. Each
weight carries the axis it is split on (None: replicated, the same on every shard), so the
bytes a process holds are known before anything is built. TensorFlow-free.

Split kinds (Megatron-LM's names in brackets):

* ``column``: a ``Dense`` split by output columns [ColumnParallelLinear];
* ``row``: a ``Dense`` split by input rows, bias after the sum [RowParallelLinear];
* ``heads``: a ``MultiHeadAttention`` split by heads;
* ``vocab``: an ``Embedding`` split by vocabulary rows [VocabParallelEmbedding];
* ``output``: the model's output ``Dense`` split by vocabulary columns; its logits stay split
  and the loss is computed on the shards [vocab-parallel cross-entropy];
* ``tied``: a tied embedding (`tfdist.tensor.tied`) split by vocabulary rows: its lookup as
  ``vocab``, its reversed call's logits split by vocabulary as ``output``;
* ``hidden``: a query/key/value projection split by its input (hidden) units, summed over the
  shards, each keeping its heads (only from a Keras ``LayoutMap``, `tfdist.kdist.layout`);
* ``replicated``: whole on every shard.

Example:
    >>> plan = TensorPlan(shards=2, layers=(
    ...     LayerSplit("ffn_in", "Dense", "column", "auto", (
    ...         WeightSplit("kernel", (4, 8), 4, 1), WeightSplit("bias", (8,), 4, 0))),
    ...     LayerSplit("norm", "LayerNormalization", "replicated", "auto", (
    ...         WeightSplit("gamma", (4,), 4, None), WeightSplit("beta", (4,), 4, None)))))
    >>> plan.whole_bytes, plan.bytes_per_process, plan.split_layers
    (192, 112, ('ffn_in',))
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from tfdist.errors import StrategyConfigError, format_error

__all__ = ["SplitKind", "SPLIT_KINDS", "LOGIT_KINDS", "WeightSplit", "LayerSplit", "TensorPlan",
           "MIN_SPLIT_SHARE", "check_coverage"]

SplitKind = Literal["column", "row", "heads", "vocab", "output", "tied", "replicated", "hidden"]
SPLIT_KINDS: tuple[str, ...] = ("column", "row", "heads", "vocab", "output", "tied",
                                "replicated")
LOGIT_KINDS: tuple[str, ...] = ("output", "tied")
"""Kinds whose layer gives the model's logits split by vocabulary."""


@dataclasses.dataclass(frozen=True)
class WeightSplit:
    """One weight of a layer: its whole shape, bytes per element, and split axis (or None)."""

    name: str
    shape: tuple[int, ...]
    itemsize: int
    axis: int | None

    @property
    def whole_bytes(self) -> int:
        size = self.itemsize
        for dim in self.shape:
            size *= dim
        return size

    def shard_shape(self, shards: int) -> tuple[int, ...]:
        """The shape one process holds."""
        if self.axis is None:
            return self.shape
        shape = list(self.shape)
        shape[self.axis] //= shards
        return tuple(shape)

    def bytes_per_process(self, shards: int) -> int:
        return self.whole_bytes if self.axis is None else self.whole_bytes // shards


@dataclasses.dataclass(frozen=True)
class LayerSplit:
    """How one layer is held: its kind, why (``auto``, a user rule, or why it cannot split),
    and its weights in ``get_weights`` order."""

    name: str
    class_name: str
    kind: SplitKind
    reason: str
    weights: tuple[WeightSplit, ...] = ()

    @property
    def split(self) -> bool:
        return self.kind != "replicated"


@dataclasses.dataclass(frozen=True)
class TensorPlan:
    """Every layer of a model with weights or a split, for ``shards`` (T) processes.

    Attributes:
        shards: T.
        layers: One `LayerSplit` per layer, in the model's order.
    """

    shards: int
    layers: tuple[LayerSplit, ...]

    def layer(self, name: str) -> LayerSplit:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)

    @property
    def split_layers(self) -> tuple[str, ...]:
        return tuple(layer.name for layer in self.layers if layer.split)

    @property
    def output_layer(self) -> str | None:
        """The layer whose logits stay split by vocabulary (kind ``output`` or ``tied``)."""
        return next((layer.name for layer in self.layers if layer.kind in LOGIT_KINDS), None)

    @property
    def vocabulary(self) -> int | None:
        """The whole vocabulary of the split logits (None without them)."""
        name = self.output_layer
        if name is None:
            return None
        layer = self.layer(name)
        return layer.weights[0].shape[0 if layer.kind == "tied" else 1]

    @property
    def whole_bytes(self) -> int:
        """Bytes of the whole model's weights."""
        return sum(w.whole_bytes for layer in self.layers for w in layer.weights)

    @property
    def split_bytes(self) -> int:
        """Bytes of the whole model's split weights (each process holds 1/T of them)."""
        return sum(w.whole_bytes for layer in self.layers for w in layer.weights
                   if w.axis is not None)

    @property
    def bytes_per_process(self) -> int:
        """Bytes one process holds: split part / T + replicated part."""
        return sum(w.bytes_per_process(self.shards) for layer in self.layers
                   for w in layer.weights)

    def as_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data."""
        return {
            "shards": self.shards, "whole_bytes": self.whole_bytes,
            "split_bytes": self.split_bytes, "bytes_per_process": self.bytes_per_process,
            "layers": [{
                "name": layer.name, "class": layer.class_name, "kind": layer.kind,
                "reason": layer.reason,
                "bytes_per_process": sum(w.bytes_per_process(self.shards)
                                         for w in layer.weights),
                "weights": [{"name": w.name, "shape": list(w.shape), "axis": w.axis}
                            for w in layer.weights]} for layer in self.layers]}

    def table(self) -> str:
        """The plan as a table: layer, class, split, bytes per process, why.

        Example:
            >>> print(TensorPlan(2, (LayerSplit("d", "Dense", "replicated", "auto", (
            ...     WeightSplit("kernel", (2, 2), 4, None),)),)).table())
            tensor plan, T=2: 16 B per process of 16 B (split 0 B / 2 + replicated 16 B)
              layer  class  split       bytes/process  why
              d      Dense  replicated  16             auto
        """
        rows = [("layer", "class", "split", "bytes/process", "why")]
        for layer in self.layers:
            size = sum(w.bytes_per_process(self.shards) for w in layer.weights)
            rows.append((layer.name, layer.class_name, layer.kind, str(size), layer.reason))
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        lines = ["  " + "  ".join(cell.ljust(width)
                                  for cell, width in zip(row, widths, strict=True)).rstrip()
                 for row in rows]
        head = (f"tensor plan, T={self.shards}: {self.bytes_per_process} B per process of "
                f"{self.whole_bytes} B (split {self.split_bytes} B / {self.shards} + replicated "
                f"{self.whole_bytes - self.split_bytes} B)")
        return "\n".join([head, *lines])


MIN_SPLIT_SHARE = 0.5
"""Below this share of the weight bytes split, a tensor job is mostly ``T`` copies of one model
doing the same work: `check_coverage` warns before training."""


def check_coverage(plan: TensorPlan, model: str = "the model") -> str | None:
    """Refuses a plan with ``T > 1`` that splits nothing; the warning to show (on the chief,
    before training) when it splits less than `MIN_SPLIT_SHARE` of the weight bytes, else None.

    Raises:
        StrategyConfigError: ``T > 1`` and no weight is split: every process would hold and
            compute the whole model, ``T`` times the work data parallelism does.

    Example:
        >>> dense = WeightSplit("kernel", (4, 4), 4, None)
        >>> check_coverage(TensorPlan(1, (LayerSplit("d", "Dense", "replicated", "auto",
        ...                                          (dense,)),))) is None
        True
        >>> check_coverage(TensorPlan(2, (LayerSplit("d", "Dense", "replicated", "auto",
        ...                                          (dense,)),)))
        Traceback (most recent call last):
        ...
        tfdist.errors.StrategyConfigError: Tensor parallelism with T=2 splits none of ...
    """
    if plan.shards == 1 or plan.whole_bytes == 0:
        return None
    share = plan.split_bytes / plan.whole_bytes
    whole = sorted((layer for layer in plan.layers if layer.kind == "replicated" and layer.weights),
                   key=lambda layer: -sum(w.whole_bytes for w in layer.weights))
    kept = [f"{layer.name} ({layer.class_name}: {layer.reason})" for layer in whole[:6]]
    if plan.split_bytes == 0:
        raise StrategyConfigError(format_error(
            f"Tensor parallelism with T={plan.shards} splits none of {model}'s weights: every "
            f"process would hold and compute the whole model, {plan.shards} times the work "
            "of data parallelism on the same processes.",
            received=f"T={plan.shards}; 0 of {plan.whole_bytes} weight bytes split; kept whole: "
            f"{', '.join(kept)}",
            expected="at least one layer the rules split (a Dense feeding a Dense, a "
            "MultiHeadAttention, an Embedding, a language model's output Dense)",
            fix="train it data-parallel on the same processes (--strategy multi_worker), or "
            "name layers to split in rules= (e.g. rules={'ffn_up': 'column', 'ffn_down': "
            "'row'})"))
    if share >= MIN_SPLIT_SHARE:
        return None
    return (f"tensor plan: T={plan.shards} splits only {share:.1%} of {model}'s weight bytes "
            f"({plan.split_bytes} of {plan.whole_bytes} B); each process holds "
            f"{plan.bytes_per_process} B, {plan.bytes_per_process / plan.whole_bytes:.0%} of the "
            f"model. Largest layers kept whole: {', '.join(kept)}")
