"""Rules that decide which layer of a Keras model is split how, and the `TensorPlan` they make.

Automatic rules read the model's graph (Keras 3 functional or Sequential, built or described
without weights) and split only what they recognise exactly:

* a ``MultiHeadAttention`` (the Keras class itself) by heads;
* an ``Embedding`` by vocabulary rows;
* a tied embedding (a ``ReversibleEmbedding``, `tfdist.tensor.tied`: ``layer(ids)`` and
  ``layer(hidden, reverse=True)`` giving the logits) by vocabulary rows, once for both uses;
* the model's output ``Dense`` (linear, as wide as an ``Embedding``'s vocabulary: a language
  model's logits) by vocabulary columns, its loss on the shards;
* a ``Dense`` whose only consumer is another ``Dense`` (a feed-forward pair): the first by
  columns, the second by rows.

Everything else is replicated, and so is a layer that cannot be split safely (called more than
once, with a regularizer, a subclass, an option the split layers do not implement); the plan
says why. A weight held by two layers is refused (`tfdist.tensor.tied.check_shared_weights`).
User rules (like ``keras.distribution.LayoutMap``) map a regular expression, matched in full
against layer names, to a kind (`tfdist.tensor.plan.SPLIT_KINDS`), and override the
automatic ones; a rule that matches no layer, a kind the layer cannot take, a column layer not
followed by row layers, or a size ``T`` does not divide is refused with the fix.

Example:
    >>> import keras
    >>> inputs = keras.Input((4, 8))
    >>> hidden = keras.layers.Dense(16, activation="relu", name="up")(inputs)
    >>> outputs = keras.layers.Dense(8, name="down")(hidden)
    >>> model = keras.Model(inputs, keras.layers.LayerNormalization(name="ln")(outputs))
    >>> plan = plan_model(model, shards=2)
    >>> [(layer.name, layer.kind) for layer in plan.layers]
    [('up', 'column'), ('down', 'row'), ('ln', 'replicated')]
    >>> plan_model(model, 2, rules={"up|down": "replicated"}).split_layers
    ()
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tfdist.errors import StrategyConfigError, format_error
from tfdist.tensor.plan import SPLIT_KINDS, LayerSplit, TensorPlan, WeightSplit
from tfdist.tensor.tied import TIED_CLASS, check_shared_weights, is_tied_class, why_not_tied

__all__ = ["plan_model", "auto_kinds", "check_rules", "CLASSES_OF_KIND"]

CLASSES_OF_KIND: Mapping[str, tuple[str, ...]] = {
    "column": ("Dense",), "row": ("Dense",), "output": ("Dense",),
    "heads": ("MultiHeadAttention",), "vocab": ("Embedding",), "tied": (TIED_CLASS,),
}
_MHA_OPTIONS = {"output_shape": None, "use_gate": False, "sliding_window": None}
_FIX_REPLICATE = "or replicate it: rules={{{name!r}: 'replicated'}}"


_CONSTRAINTS = ("kernel_constraint", "bias_constraint", "embeddings_constraint")


def _class(layer: Any) -> str:
    return type(layer).__name__


def _is_keras(layer: Any, name: str) -> bool:
    """Whether ``layer`` is the Keras class ``name`` itself (a subclass may change ``call``)."""
    return _class(layer) == name and type(layer).__module__.startswith("keras.")


def _consumers(layer: Any) -> list[Any]:
    return [node.operation for node in layer._outbound_nodes]


def _producers(layer: Any) -> list[Any]:
    nodes = layer._inbound_nodes
    return [parent.operation for parent in nodes[0].parent_nodes] if nodes else []


def _why_not_split(layer: Any) -> str | None:
    """Why ``layer`` must stay whole, or None."""
    if len(layer._inbound_nodes) > 1:
        return "called more than once"
    config = layer.get_config()
    if any(config.get(key) for key in ("kernel_regularizer", "bias_regularizer",
                                       "embeddings_regularizer", "activity_regularizer")):
        return "has a regularizer (its loss would be summed per shard)"
    constraints = [config.get(key) for key in _CONSTRAINTS]
    if any(c and (not isinstance(c, dict) or c.get("class_name") != "NonNeg")
           for c in constraints):  # NonNeg is per element: the same on a shard
        return "has a constraint (it would be applied to each shard, not the whole weight)"
    if _is_keras(layer, "MultiHeadAttention"):
        axes = config.get("attention_axes")
        if any(config.get(key, default) != default for key, default in _MHA_OPTIONS.items()) \
                or axes not in (None, (1,), [1]):
            return "an output_shape/attention_axes/gate/sliding window the split does not do"
    if _is_keras(layer, "Embedding") and config.get("mask_zero"):
        return "mask_zero (the mask is computed whole)"
    if _is_keras(layer, "Dense") and getattr(layer, "lora_enabled", False):
        return "LoRA"
    return None


def auto_kinds(model: Any) -> dict[str, tuple[str, str]]:
    """Each layer's automatic ``(kind, reason)`` (before user rules and divisibility)."""
    layers = _layers(model)
    outputs = {id(t._keras_history[0]) for t in model.outputs}
    vocabularies = {layer.get_config()["input_dim"] for layer in layers
                    if _is_keras(layer, "Embedding")}
    kinds: dict[str, tuple[str, str]] = {}
    for layer in layers:
        if is_tied_class(layer):
            blocker = why_not_tied(layer, model)
            kinds[layer.name] = ("tied", "auto: tied embedding rows, logits by vocabulary") \
                if blocker is None else ("replicated", blocker)
            continue
        blocker = _why_not_split(layer)
        kinds[layer.name] = ("replicated", blocker or "not a layer the rules split")
        if blocker is not None:
            continue
        if _is_keras(layer, "MultiHeadAttention"):
            kinds[layer.name] = ("heads", "auto: attention heads")
        elif _is_keras(layer, "Embedding"):
            kinds[layer.name] = ("vocab", "auto: embedding rows")
        elif _is_keras(layer, "Dense") and id(layer) in outputs and len(outputs) == 1 \
                and layer.get_config().get("activation") in (None, "linear") \
                and layer.get_config()["units"] in vocabularies:
            kinds[layer.name] = ("output", "auto: output logits by vocabulary")
    for layer in layers:
        if kinds[layer.name][0] != "replicated" or _why_not_split(layer) is not None:
            continue
        consumers = _consumers(layer)
        if (_is_keras(layer, "Dense") and len(consumers) == 1
                and _is_keras(consumers[0], "Dense")
                and kinds[consumers[0].name][0] == "replicated"
                and _why_not_split(consumers[0]) is None
                and id(consumers[0]) not in outputs
                and layer.get_config().get("activation") != "softmax"):
            kinds[layer.name] = ("column", "auto: feed-forward pair, first")
            kinds[consumers[0].name] = ("row", "auto: feed-forward pair, second")
    return kinds


def _layers(model: Any) -> list[Any]:
    return [layer for layer in model.layers if _class(layer) != "InputLayer"]


def check_rules(rules: Mapping[str, str] | None) -> dict[str, str]:
    """``rules`` as a dict, each pattern a regular expression that compiles; checked when a
    strategy is made, before anything waits or trains.

    Raises:
        StrategyConfigError: a pattern that is not a string or does not compile (Python's bare
            ``re.error`` before), or ``rules`` that is not a mapping.

    Example:
        >>> check_rules({"ffn_.*": "replicated"})
        {'ffn_.*': 'replicated'}
        >>> try:
        ...     check_rules({"ffn_[": "replicated"})
        ... except StrategyConfigError as err:
        ...     print(str(err)[:52])
        Tensor rule 'ffn_[' is not a valid regular express
    """
    if rules is None:
        return {}
    if not isinstance(rules, Mapping):
        raise StrategyConfigError(format_error(
            "Tensor rules map layer-name patterns to splits.", received=f"rules={rules!r}",
            expected="a dict {regex: kind}", fix="pass rules={'ffn_.*': 'replicated'}"))
    for pattern, kind in rules.items():
        try:
            re.compile(pattern)
        except (re.error, TypeError) as err:
            raise StrategyConfigError(format_error(
                f"Tensor rule {pattern!r} is not a valid regular expression ({err}).",
                received=f"rules={{{pattern!r}: {kind!r}}}",
                expected="a Python regular expression matching whole layer names",
                fix="escape special characters (re.escape(name)) or correct the pattern"))\
                from None
    return dict(rules)


def _apply_rules(model: Any, kinds: dict[str, tuple[str, str]],
                 rules: Mapping[str, str]) -> None:
    names = [layer.name for layer in _layers(model)]
    for pattern, kind in rules.items():
        if kind not in SPLIT_KINDS:
            raise StrategyConfigError(format_error(
                f"Tensor rule {pattern!r} names an unknown split.",
                received=f"{pattern!r}: {kind!r}", expected=f"one of {SPLIT_KINDS}",
                fix="use 'column'/'row' for Dense pairs, 'heads' for MultiHeadAttention, "
                "'vocab' for Embedding, 'output' for the logits, 'tied' for a "
                f"{TIED_CLASS}, or 'replicated'"))
        matched = [name for name in names if re.fullmatch(pattern, name)]
        if not matched:
            raise StrategyConfigError(format_error(
                f"Tensor rule {pattern!r} matches no layer.",
                received=f"rules={{{pattern!r}: {kind!r}}}",
                expected=f"a regular expression matching in full one of {names}",
                fix="correct the pattern (it must match the whole layer name) or drop it"))
        for name in matched:
            kinds[name] = (kind, f"rule {pattern!r}")


def _check_tied(model: Any, layer: Any, kind: str, reason: str) -> None:
    """Refuses a tied embedding split as anything but ``tied``, or one ``tied`` cannot split."""
    if kind == "tied":
        blocker = why_not_tied(layer, model)
        if blocker is not None:
            raise StrategyConfigError(format_error(
                f"Layer {layer.name!r} cannot be split as a tied embedding ({reason}): "
                f"{blocker}.", received=f"{layer.name}: tied ({_class(layer)})",
                expected=f"a {TIED_CLASS} (tie_weights) called once as layer(ids) and once as "
                "layer(hidden, reverse=True), that call the model's only output",
                fix=f"replicate it: rules={{{layer.name!r}: 'replicated'}}"))
    elif kind != "replicated" and is_tied_class(layer):
        raise StrategyConfigError(format_error(
            f"Layer {layer.name!r} ({TIED_CLASS}) ties its embedding to the logits: split as "
            f"{kind!r} ({reason}), one of its uses would read the matrix split the wrong way.",
            received=f"{layer.name}: {kind}", expected="'tied' or 'replicated'",
            fix=f"rules={{{layer.name!r}: 'tied'}} or {{{layer.name!r}: 'replicated'}}"))


def _check_kind(layer: Any, kind: str, reason: str) -> None:
    allowed = CLASSES_OF_KIND.get(kind)
    if kind == "tied" or is_tied_class(layer):
        return  # `_check_tied`
    if allowed is not None and not any(_is_keras(layer, c) for c in allowed):
        raise StrategyConfigError(format_error(
            f"Layer {layer.name!r} ({_class(layer)}) cannot be split as {kind!r} ({reason}).",
            received=f"{layer.name}: {kind}", expected=f"a Keras {' or '.join(allowed)} layer",
            fix=f"give {layer.name!r} a kind its class takes, or 'replicated'"))
    blocker = None if kind == "replicated" else _why_not_split(layer)
    if blocker is not None:
        raise StrategyConfigError(format_error(
            f"Layer {layer.name!r} cannot be split ({reason}): {blocker}.",
            received=f"{layer.name}: {kind}", expected="a layer without that",
            fix=f"replicate it: rules={{{layer.name!r}: 'replicated'}}"))


def _check_pairs(model: Any, kinds: dict[str, tuple[str, str]]) -> None:
    for layer in _layers(model):
        kind = kinds[layer.name][0]
        if kind == "column":
            bad = [c.name for c in _consumers(layer) if kinds.get(c.name, ("",))[0] != "row"]
            if bad or not _consumers(layer):
                raise StrategyConfigError(format_error(
                    f"Column-split layer {layer.name!r} feeds layers that are not row-split: "
                    "they would read one shard of its output as the whole.",
                    received=f"{layer.name}: column -> {bad or 'the model output'}",
                    expected="every consumer of a column layer split by rows",
                    fix=f"split {bad} as 'row', or make {layer.name!r} 'replicated'"))
        if kind == "row":
            bad = [p.name for p in _producers(layer) if kinds.get(p.name, ("",))[0] != "column"]
            if bad:
                raise StrategyConfigError(format_error(
                    f"Row-split layer {layer.name!r} reads layers that are not column-split.",
                    received=f"{bad} -> {layer.name}: row",
                    expected="a row layer fed by column layers only",
                    fix=f"split {bad} as 'column', or make {layer.name!r} 'replicated'"))


def _split_size(layer: Any, kind: str) -> tuple[str, int]:
    config = layer.get_config()
    if kind in ("column", "output"):
        return "units", config["units"]
    if kind == "row":
        return "input width", int(layer.kernel.shape[0])
    if kind == "heads":
        return "num_heads", config["num_heads"]
    return "input_dim (vocabulary)", config["input_dim"]


def _check_divisible(layer: Any, kind: str, shards: int) -> None:
    field, size = _split_size(layer, kind)
    if size % shards:
        raise StrategyConfigError(format_error(
            f"Layer {layer.name!r} cannot be split {shards} ways by {kind}: its {field} "
            f"{size} is not a multiple of {shards}.",
            received=f"{layer.name}.{field}={size}, tensor shards T={shards}",
            expected=f"{field} divisible by T",
            fix=f"use T dividing {size}, make {field} a multiple of {shards}, "
            + _FIX_REPLICATE.format(name=layer.name)))


def _weight_axis(kind: str, path: str) -> int | None:
    parts = path.split("/")
    leaf, owner = parts[-1].split(":")[0], parts[-2] if len(parts) > 1 else ""
    if kind in ("column", "output"):
        return 1 if leaf == "kernel" else 0
    if kind == "row":
        return 0 if leaf == "kernel" else None
    if kind in ("vocab", "tied"):
        return 0
    if kind == "heads":
        if owner == "attention_output":
            return 0 if leaf == "kernel" else None
        return 1 if leaf == "kernel" else 0
    return None


def _weights(layer: Any, kind: str) -> tuple[WeightSplit, ...]:
    import numpy as np

    return tuple(
        WeightSplit(getattr(w, "path", w.name), tuple(int(d) for d in w.shape),
                    int(np.dtype(str(getattr(w.dtype, "name", w.dtype))).itemsize),
                    _weight_axis(kind, getattr(w, "path", w.name)))
        for w in layer.weights)


def plan_model(model: Any, shards: int, rules: Mapping[str, str] | None = None) -> TensorPlan:
    """Decides each layer's split for ``shards`` processes (automatic rules, then ``rules``).

    Args:
        model: A built Keras 3 model (its weights may be unallocated, `abstract_build`).
        shards: T.
        rules: ``{layer-name regex: kind}``, overriding the automatic kinds.

    Raises:
        StrategyConfigError: a weight held by two layers, a rule that matches nothing or
            names a kind the layer cannot take (a tied embedding: ``tied`` or nothing), a
            column layer whose consumers are not row layers (or the reverse), or a split
            size that ``shards`` does not divide.
    """
    layers = _layers(model)
    check_shared_weights(layers)
    kinds = auto_kinds(model)
    _apply_rules(model, kinds, rules or {})
    for layer in layers:
        kind, reason = kinds[layer.name]
        _check_tied(model, layer, kind, reason)
        _check_kind(layer, kind, reason)
        if kind != "replicated" and shards > 1:
            _check_divisible(layer, kind, shards)
    _check_pairs(model, kinds)
    return TensorPlan(shards, tuple(
        LayerSplit(layer.name, _class(layer), kinds[layer.name][0], kinds[layer.name][1],
                   _weights(layer, kinds[layer.name][0]))
        for layer in layers))
