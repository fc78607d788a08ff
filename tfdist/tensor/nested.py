"""Splits inside blocks: the tensor plan of a model whose layers hold layers (KerasHub).

`tfdist.tensor.rules` reads a model's top-level graph. A KerasHub model (``GPT2CausalLM``,
``LlamaCausalLM``, ...) is a functional task model around a functional backbone whose
Transformer blocks are custom layers (``TransformerDecoder``, ``LlamaTransformerDecoder``)
holding their ``Dense``, ``EinsumDense`` and attention layers. `plan_nested` walks that whole
layer tree and groups what it can split into units:

* attention by heads: a layer holding ``EinsumDense`` children named ``query``, ``key``,
  ``value`` and ``attention_output`` (Keras's ``MultiHeadAttention`` and subclasses such as
  KerasHub's ``CachedMultiHeadAttention``, Llama's and Gemma's attention): the query, key and
  value projections by their heads axis (``column``), the output projection by its heads axis
  (``row``, its bias added once after the sum). Grouped-query key/value heads are split too
  where T divides them; where T is a multiple of them they stay whole on every shard (each
  shard reads the one key/value head of its query heads); otherwise the attention stays whole;
* a feed-forward group inside a block: ``Dense`` (or 2-D ``EinsumDense``) children widening the
  width ``d`` to ``f`` (up, and a gate) and one narrowing ``f`` back to ``d`` (down): up and
  gate by columns, down by rows;
* a ``ReversibleEmbedding`` (any module: KerasHub's, Keras's) by vocabulary rows; when its
  reversed call gives the model's only output (the causal LM's logits), kind ``tied``: its
  logits stay split by vocabulary for the sharded cross-entropy; an untied one's
  ``reverse_embeddings`` by vocabulary columns. A plain ``Embedding`` inside by rows.

Each weighted leaf layer gets one `LayerSplit` named by its path in the tree
(``gpt2_backbone/transformer_layer_0/self_attention/query``). A layer kept whole says why; a
split ``T`` does not divide keeps the layer whole (the automatic rules chose it) and says so.
`tfdist.tensor.check` then runs each block whole and split before training.

Example:
    >>> import keras
    >>> class Block(keras.layers.Layer):
    ...     def __init__(self, **kwargs):
    ...         super().__init__(**kwargs)
    ...         self.up = keras.layers.Dense(16, activation="relu", name="up")
    ...         self.down = keras.layers.Dense(4, name="down")
    ...     def call(self, x):
    ...         return x + self.down(self.up(x))
    >>> inputs = keras.Input((3, 4))
    >>> model = keras.Model(inputs, Block(name="block")(inputs))
    >>> plan, units = plan_nested(model, shards=2)
    >>> [(layer.name, layer.kind) for layer in plan.layers]
    [('block/up', 'column'), ('block/down', 'row')]
    >>> units[0].kind, units[0].block
    ('feed-forward', 'block')
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from tfdist.errors import StrategyConfigError, format_error
from tfdist.tensor.plan import LayerSplit, TensorPlan, WeightSplit
from tfdist.tensor.tied import TIED_CLASS

__all__ = ["Unit", "walk", "is_nested", "plan_nested", "layer_at", "own_weights", "entry_variables",
           "demote"]

ATTENTION_PARTS = ("query", "key", "value", "attention_output")
_BLOCKING = ("kernel_regularizer", "bias_regularizer", "embeddings_regularizer",
             "activity_regularizer", "kernel_constraint", "bias_constraint",
             "embeddings_constraint", "lora_rank", "quantization_config", "mask_zero")


@dataclasses.dataclass(frozen=True)
class Unit:
    """Layers split together: an attention's projections, a feed-forward group, an embedding.

    Attributes:
        kind: ``attention``, ``feed-forward`` or ``embedding``.
        block: Path of the layer the pre-training check runs whole and split (None: none).
        paths: The leaf layers' paths.
        owner: The attention layer's path (its head counts become the shard's).
        heads: Query heads (attention).
        kv_heads: Key/value heads (attention).
        kv_whole: Key/value projections kept whole (T a multiple of ``kv_heads``).
    """

    kind: str
    block: str | None
    paths: tuple[str, ...]
    owner: str | None = None
    heads: int = 0
    kv_heads: int = 0
    kv_whole: bool = False


def _children(layer: Any) -> list[Any]:
    return [c for c in layer._flatten_layers(include_self=False, recursive=False)
            if type(c).__name__ != "InputLayer"]


def walk(model: Any) -> list[tuple[str, Any]]:
    """Every layer below ``model`` once, as ``(path, layer)``, parents before children."""
    seen: set[int] = set()
    found: list[tuple[str, Any]] = []

    def visit(layer: Any, prefix: str) -> None:
        for child in _children(layer):
            if id(child) in seen:
                continue
            seen.add(id(child))
            path = f"{prefix}{child.name}"
            found.append((path, child))
            visit(child, path + "/")

    visit(model, "")
    return found


def layer_at(model: Any, path: str) -> Any:
    """The layer at ``path`` (``a/b/c``) below ``model``.

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="d")])
        >>> layer_at(model, "d").name
        'd'
    """
    layer = model
    for name in path.split("/"):
        layer = next((c for c in _children(layer) if c.name == name), None)
        if layer is None:
            raise KeyError(path)
    return layer


def own_weights(layer: Any) -> list[Any]:
    """The variables ``layer`` holds itself (not through its sublayers)."""
    below = {id(w) for child in _children(layer) for w in child.weights}
    return [w for w in layer.weights if id(w) not in below]


def entry_variables(model: Any, entry: LayerSplit) -> list[Any]:
    """The variables of ``model`` that plan entry ``entry`` describes, in its order (a
    top-level plan's layer: all its weights; a nested plan's leaf: its own)."""
    layer = layer_at(model, entry.name)
    variables = list(layer.weights)
    return variables if len(variables) == len(entry.weights) else own_weights(layer)


def _is_model(layer: Any) -> bool:
    import keras

    return isinstance(layer, keras.Model)


def _is_keras_mha(layer: Any) -> bool:
    return type(layer).__name__ == "MultiHeadAttention" and \
        type(layer).__module__.startswith("keras.")


def is_nested(model: Any) -> bool:
    """Whether a top-level layer of ``model`` holds weighted layers the top-level rules
    (`tfdist.tensor.rules`) do not see: a nested model, or a custom block."""
    return any(not _is_keras_mha(layer) and any(c.weights for c in _children(layer))
               for layer in _children(model))


def _config(layer: Any) -> dict[str, Any]:
    """``layer.get_config()``, or {} where it fails (some KerasHub layers' do once built)."""
    try:
        return layer.get_config()
    except Exception:  # noqa: BLE001
        return {}


def _blocker(layer: Any) -> str | None:
    config = _config(layer)
    found = [key for key in _BLOCKING if config.get(key)]
    if found:
        return f"{found[0]}={config[found[0]]!r} (the split does not do it)"
    if getattr(layer, "quantization_mode", None):
        return "quantized"
    return None


def _einsum(layer: Any) -> tuple[str, str, str]:
    """``(input, kernel, output)`` letters of an ``EinsumDense`` (or a ``Dense`` as one)."""
    if type(layer).__name__ == "Dense":
        return "...i", "io", "...o"
    inputs, output = layer.equation.split("->")
    first, kernel = inputs.split(",")
    return first, kernel, output


def _axes(layer: Any, letter: str) -> dict[str, int | None]:
    """Axis of ``letter`` in the kernel and the bias (None where absent)."""
    _, kernel, _ = _einsum(layer)
    bias_axes = "o" if type(layer).__name__ == "Dense" else (layer.bias_axes or "")
    return {"kernel": kernel.index(letter),
            "bias": bias_axes.index(letter) if letter in bias_axes else None}


def _linear(layer: Any) -> bool:
    return type(layer).__name__ in ("Dense", "EinsumDense") and \
        type(layer).__module__.startswith("keras.")


@dataclasses.dataclass
class _Draft:
    """Kinds and weight axes chosen so far, by leaf path."""

    shards: int
    kinds: dict[str, tuple[str, str, dict[str, int | None]]] = \
        dataclasses.field(default_factory=dict)
    units: list[Unit] = dataclasses.field(default_factory=list)

    def keep(self, path: str, reason: str) -> None:
        self.kinds[path] = ("replicated", reason, {})

    def divides(self, size: int) -> bool:
        return size % self.shards == 0


def _attention(draft: _Draft, path: str, layer: Any, block: str) -> None:
    parts = {c.name: c for c in _children(layer)}
    paths = {name: f"{path}/{name}" for name in ATTENTION_PARTS}
    output = parts["attention_output"]
    heads_letter = _einsum(output)[0][-2]
    heads = int(output.kernel.shape[_axes(output, heads_letter)["kernel"]])
    key = parts["key"]
    key_letter = _einsum(key)[2][-2]
    kv_heads = int(key.kernel.shape[_axes(key, key_letter)["kernel"]])
    why = next((f"{name}: {b}" for name in ATTENTION_PARTS
                if (b := _blocker(parts[name])) is not None), None)
    if why is None and not draft.divides(heads):
        why = (f"num_heads={heads} is not a multiple of T={draft.shards} (use a T dividing "
               f"{heads})")
    kv_whole = kv_heads != heads and not draft.divides(kv_heads)
    if why is None and kv_whole and draft.shards % kv_heads:
        why = (f"num_key_value_heads={kv_heads}: T={draft.shards} neither divides it nor is "
               f"a multiple of it (use a T dividing {heads} that divides or is a multiple of "
               f"{kv_heads})")
    if why is not None:
        for name in ATTENTION_PARTS:
            draft.keep(paths[name], f"attention kept whole: {why}")
        return
    for name in ("query", "key", "value"):
        if kv_whole and name != "query":
            draft.keep(paths[name], f"key/value heads {kv_heads} < T={draft.shards}: whole on "
                       "every shard, each reads its query heads' key/value head")
            continue
        draft.kinds[paths[name]] = ("column", f"auto: attention heads ({name})",
                                    _axes(parts[name], _einsum(parts[name])[2][-2]))
    draft.kinds[paths["attention_output"]] = ("row", "auto: attention heads (output)",
                                              _axes(output, heads_letter))
    draft.units.append(Unit("attention", block, tuple(paths.values()), path, heads, kv_heads,
                            kv_whole))


def _feed_forward(draft: _Draft, path: str, layer: Any, block: str) -> None:
    """Up (and gate) by columns, down by rows, among ``layer``'s direct children."""
    linear = [c for c in _children(layer) if _linear(c) and f"{path}/{c.name}" not in draft.kinds
              and len(c.kernel.shape) == 2 and _blocker(c) is None
              and (_einsum(c)[0][-1], _einsum(c)[2][-1]) == tuple(_einsum(c)[1])]
    groups = []
    for place, down in enumerate(linear):
        width, out = (int(d) for d in down.kernel.shape)
        ups = [c for c in linear[:place] if tuple(c.kernel.shape) == (out, width)]
        if width == out or not 0 < len(ups) <= 2:
            continue
        if not draft.divides(width):
            for member in (*ups, down):
                draft.keep(f"{path}/{member.name}", f"feed-forward kept whole: its inner width "
                           f"{width} is not a multiple of T={draft.shards} (use a T dividing it)")
            return
        groups.append((len(ups), ups, down))
    for _, ups, down in sorted(groups, key=lambda group: -group[0])[:1]:
        for up in ups:
            draft.kinds[f"{path}/{up.name}"] = ("column", "auto: feed-forward, up",
                                                _axes(up, _einsum(up)[2][-1]))
        draft.kinds[f"{path}/{down.name}"] = ("row", "auto: feed-forward, down",
                                              _axes(down, _einsum(down)[0][-1]))
        names = tuple(f"{path}/{c.name}" for c in (*ups, down))
        draft.units.append(Unit("feed-forward", block, names))


def _embedding(draft: _Draft, model: Any, path: str, layer: Any) -> None:
    rows = int(layer.input_dim)
    why = _blocker(layer)
    if why is None and not draft.divides(rows):
        why = (f"input_dim (vocabulary)={rows} is not a multiple of T={draft.shards} (pad the "
               f"vocabulary to a multiple of {draft.shards})")
    if why is None and not layer._inbound_nodes:
        why = "no recorded call (built outside a functional graph)"
    reversed_uses = [n for n in layer._inbound_nodes if n.arguments.kwargs.get("reverse")]
    output = model.outputs[0]._keras_history if len(model.outputs) == 1 else None
    tied = bool(reversed_uses) and output is not None and output[0] is layer and \
        layer._inbound_nodes[output[1]] in reversed_uses and len(reversed_uses) == 1
    if why is None and reversed_uses and not tied:
        why = "its reversed call is not the model's only output (the loss reads the logits)"
    if why is not None:
        draft.keep(path, why)
        return
    kind = "tied" if tied else "vocab"
    reason = "auto: vocabulary rows, logits by vocabulary" if tied else "auto: vocabulary rows"
    draft.kinds[path] = (kind, reason, {"embeddings": 0, "reverse_embeddings": 1})
    draft.units.append(Unit("embedding", None, (path,)))


def _block_of(path: str, containers: Mapping[str, Any]) -> str:
    """The outermost layer on ``path`` that is not a model: the check runs it."""
    parts = path.split("/")
    for end in range(1, len(parts) + 1):
        prefix = "/".join(parts[:end])
        if not _is_model(containers[prefix]):
            return prefix
    return path


def _is_attention(layer: Any) -> bool:
    names = {c.name: c for c in _children(layer)}
    return all(name in names and type(names[name]).__name__ == "EinsumDense"
               for name in ATTENTION_PARTS)


def _weights(layer: Any, axes: Mapping[str, int | None]) -> tuple[WeightSplit, ...]:
    import numpy as np

    def leaf(w: Any) -> str:
        return w.path.split("/")[-1].split(":")[0]

    def axis(w: Any) -> int | None:
        name = leaf(w)
        return axes.get("kernel" if name == "kernel" else name)

    return tuple(WeightSplit(w.path, tuple(int(d) for d in w.shape),
                             int(np.dtype(str(getattr(w.dtype, "name", w.dtype))).itemsize),
                             axis(w)) for w in own_weights(layer))


def _apply_rules(draft: _Draft, paths: list[str], rules: Mapping[str, str]) -> None:
    """User rules inside blocks: ``replicated`` only (the automatic units decide splits)."""
    for pattern, kind in rules.items():
        matched = [p for p in paths if re.fullmatch(pattern, p)]
        if kind != "replicated" or not matched:
            raise StrategyConfigError(format_error(
                f"Tensor rule {pattern!r} cannot apply inside this model's blocks.",
                received=f"rules={{{pattern!r}: {kind!r}}}",
                expected=f"'replicated' for a pattern matching in full one of {paths[:6]}...",
                fix="keep layers whole with 'replicated' rules on their paths, or drop it"))
        for unit in [u for u in draft.units if any(re.fullmatch(pattern, p) for p in u.paths)]:
            draft.units.remove(unit)
            for path in unit.paths:
                draft.keep(path, f"rule {pattern!r} (with its {unit.kind})")


def plan_nested(model: Any, shards: int,
                rules: Mapping[str, str] | None = None) -> tuple[TensorPlan, tuple[Unit, ...]]:
    """The plan of every weighted leaf layer of ``model`` (built), and the units it splits.

    Args:
        model: A built Keras 3 model (a KerasHub task or backbone, or any model of blocks).
        shards: T.
        rules: ``{path regex: 'replicated'}``: units to keep whole.

    Raises:
        StrategyConfigError: a rule that is not ``replicated`` or matches no layer.
    """
    draft = _Draft(shards)
    layers = walk(model)
    containers = dict(layers)
    for path, layer in layers:
        if path in draft.kinds:
            continue
        if _is_attention(layer) and not _is_model(layer):
            _attention(draft, path, layer, _block_of(path, containers))
        elif type(layer).__name__ in (TIED_CLASS, "Embedding"):
            _embedding(draft, model, path, layer)
        elif _children(layer) and not _is_model(layer):
            _feed_forward(draft, path, layer, _block_of(path, containers))
    leaves = [(p, layer) for p, layer in layers if own_weights(layer)]
    _apply_rules(draft, [p for p, _ in leaves], rules or {})
    entries = []
    for path, layer in leaves:
        kind, reason, axes = draft.kinds.get(path, ("replicated", _why_whole(layer), {}))
        entries.append(LayerSplit(path, type(layer).__name__, kind, reason,
                                  _weights(layer, axes)))
    return TensorPlan(shards, tuple(entries)), tuple(draft.units)


def _why_whole(layer: Any) -> str:
    return _blocker(layer) or "not a layer the rules split"


def demote(plan: TensorPlan, units: tuple[Unit, ...], blocks: Mapping[str, str]
           ) -> tuple[TensorPlan, tuple[Unit, ...]]:
    """``plan`` and ``units`` with the units of ``blocks`` (path: why) kept whole."""
    dropped = {path: blocks[u.block] for u in units if u.block in blocks for path in u.paths}
    layers = tuple(
        dataclasses.replace(layer, kind="replicated", reason=f"block check: {dropped[layer.name]}",
                            weights=tuple(dataclasses.replace(w, axis=None)
                                          for w in layer.weights))
        if layer.name in dropped else layer for layer in plan.layers)
    return TensorPlan(plan.shards, layers), tuple(u for u in units if u.block not in blocks)
