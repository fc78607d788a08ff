"""A Keras ``LayoutMap`` as the tensor engine's split rules, honoured exactly or refused.

Keras's ``LayoutMap`` maps a variable-path pattern to a layout: one mesh axis name (or None)
per dimension of the variable. The tensor engine (`tfdist.tensor.nested.plan_nested`) knows the
splits it can do exactly: attention by heads (query/key/value by their heads axis, the output
projection by its heads axis), feed-forward groups (up and gate by columns, down by rows),
embeddings by vocabulary rows. `plan_from_layout` reads the layout of every variable and:

* a unit (an attention, a feed-forward group, an embedding) none of whose variables the
  LayoutMap shards on the model axis is kept whole, as Keras would keep them replicated;
* a unit whose layouts shard the model axis exactly where the engine splits is split; its
  variables the LayoutMap does not name follow their unit (the plan says so);
* a query/key/value kernel sharded on its hidden (input) axis, as KerasHub's Llama, Gemma and
  Mistral recipes shard them, is split that way (kind ``hidden``, `tfdist.tensor.inplace`):
  each process multiplies its slice of the hidden units, the group sums the projections, and
  each process keeps its heads for the attention; the same arithmetic as the heads split, the
  kernel 1/T per process, one more all-reduce;
* a pair of top-level ``Dense`` layers the LayoutMap shards ``(None, model)`` then
  ``(model, None)`` becomes a column/row pair (the guide's MLP);
* anything else sharded on the model axis is refused before training, naming the variable, the
  layout and the nearest layout the engine does (Keras would have sharded it; tfdist will not
  silently replicate it).

A layout that also names the batch axis on a weight (KerasHub's recipes do: FSDP-style) is
honoured on the model axis; the weight is held whole on each data replica, and the plan says so
(tfdist does not shard weights over the data axis). Entries ending in ``/output`` are Keras's
activation layouts: the engine places activations itself, so they are accepted as hints when
they name a layer, refused when they name none.

Example:
    >>> import keras
    >>> inputs = keras.Input((4,))
    >>> hidden = keras.layers.Dense(8, activation="relu", name="d1")(inputs)
    >>> model = keras.Model(inputs, keras.layers.Dense(2, name="d2")(hidden))
    >>> mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], ["cpu:0", "cpu:1"])
    >>> layout_map = keras.distribution.LayoutMap(mesh)
    >>> layout_map["d1/kernel"] = (None, "model")
    >>> layout_map["d2/kernel"] = ("model", None)
    >>> found = plan_from_layout(model, layout_map, "model", "batch", shards=2)
    >>> [(layer.name, layer.kind) for layer in found.plan.layers]
    [('d1', 'column'), ('d2', 'row')]
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from tfdist.errors import StrategyConfigError, format_error
from tfdist.tensor.nested import Unit, layer_at, plan_nested, walk
from tfdist.tensor.plan import LayerSplit, TensorPlan, WeightSplit

__all__ = ["plan_from_layout", "LayoutPlan", "layout_of"]

_OUTPUT = "/output"


@dataclasses.dataclass(frozen=True)
class LayoutPlan:
    """What a LayoutMap makes of a model: the engine's plan, its units, and notes for the user.

    Attributes:
        plan: The `TensorPlan` (kinds and weight axes as the LayoutMap asks).
        units: The units split together.
        notes: Lines for the chief's log (weights held whole over the data axis, activation
            hints, variables that follow their unit).
    """

    plan: TensorPlan
    units: tuple[Unit, ...]
    notes: tuple[str, ...]


def _entries(layout_map: Any) -> dict[str, tuple[Any, ...]]:
    return {key: tuple(layout_map[key].axes) for key in layout_map}


def layout_of(layout_map: Any, path: str) -> tuple[str | None, tuple[Any, ...] | None]:
    """``(pattern, axes)`` of the LayoutMap entry for ``path`` (``(None, None)``: none).

    Raises:
        StrategyConfigError: ``path`` matches several entries (Keras's own rule).
    """
    entries = _entries(layout_map)
    if path in entries:
        return path, entries[path]
    found = [key for key in entries if re.fullmatch(key, path)]
    if len(found) > 1:
        raise StrategyConfigError(format_error(
            f"Variable {path!r} matches several LayoutMap entries.", received=str(found),
            expected="at most one entry per variable path",
            fix="make the patterns exclusive (anchor them on the layer names)"))
    return (found[0], entries[found[0]]) if found else (None, None)


def _check_entries(layout_map: Any, paths: list[str], layers: list[str]) -> list[str]:
    """Refuses an entry that matches no variable; returns notes for the activation hints."""
    notes = []
    for key, axes in _entries(layout_map).items():
        if any(key == p or re.fullmatch(key, p) for p in paths):
            continue
        if key.endswith(_OUTPUT) and any(re.fullmatch(key, f"{layer}{_OUTPUT}")
                                         for layer in layers):
            notes.append(f"LayoutMap {key!r} -> {axes}: an activation layout, a hint only "
                         "(the tensor engine places activations)")
            continue
        raise StrategyConfigError(format_error(
            f"LayoutMap entry {key!r} matches no variable of the model.",
            received=f"layout_map[{key!r}] = {axes}",
            expected=f"a pattern matching in full a variable path, e.g. {paths[:4]}",
            fix="print [v.path for v in model.variables] and correct the pattern, or drop it"))
    return notes


def _model_position(path: str, key: str, axes: tuple[Any, ...], shape: tuple[int, ...],
                    model_axis: str | None) -> int | None:
    if len(axes) != len(shape):
        raise StrategyConfigError(format_error(
            f"LayoutMap entry {key!r} gives variable {path!r} a layout of another rank.",
            received=f"{axes} for shape {shape}", expected=f"{len(shape)} axis names or None",
            fix=f"layout_map[{key!r}] = a tuple of {len(shape)} entries"))
    found = [i for i, axis in enumerate(axes) if axis is not None and axis == model_axis]
    if len(found) > 1:
        raise StrategyConfigError(format_error(
            f"LayoutMap entry {key!r} shards variable {path!r} twice on {model_axis!r}.",
            received=str(axes), expected=f"{model_axis!r} on at most one dimension",
            fix=f"name {model_axis!r} once"))
    return found[0] if found else None


def _nearest(shape: tuple[int, ...], axis: int | None, model_axis: str | None) -> tuple:
    return tuple(model_axis if i == axis else None for i in range(len(shape)))


def _refuse(weight: WeightSplit, entry: LayerSplit, key: str, axes: tuple, pos: int,
            model_axis: str | None, why: str) -> None:
    nearest = _nearest(weight.shape, weight.axis, model_axis)
    what = "kept whole on every process" if weight.axis is None else "the split tfdist does"
    raise StrategyConfigError(format_error(
        f"LayoutMap entry {key!r} shards variable {weight.name!r} ({entry.class_name} "
        f"{entry.name}, shape {weight.shape}) on dimension {pos} over {model_axis!r}, which no "
        f"tfdist split implements for it ({why}).",
        received=f"layout_map[{key!r}] = {axes}",
        expected=f"{nearest} ({what})",
        fix=f"layout_map[{key!r}] = {nearest}, or a pattern that leaves {weight.name!r} out"))


@dataclasses.dataclass
class _Draft:
    """Per leaf path: its kind, reason and weight axes as decided so far."""

    plan: TensorPlan
    kinds: dict[str, tuple[str, str, tuple[int | None, ...]]] = dataclasses.field(
        default_factory=dict)
    units: list[Unit] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def whole(self, entry: LayerSplit, reason: str) -> None:
        self.kinds[entry.name] = ("replicated", reason, tuple(None for _ in entry.weights))


def _hidden_axis(model: Any, entry: LayerSplit, unit: Unit) -> int | None:
    """The kernel axis of a query/key/value projection's hidden (input) units, or None."""
    if unit.kind != "attention" or entry.name not in unit.paths[:3] or unit.kv_whole:
        return None
    layer = layer_at(model, entry.name)
    equation = getattr(layer, "equation", None)
    if equation is None:
        return None
    first, kernel = equation.split("->")[0].split(",")
    return kernel.index(first[-1]) if first[-1] in kernel else None


def _unit(model: Any, draft: _Draft, unit: Unit, layouts: Mapping[str, Any],
          model_axis: str | None) -> None:
    entries = [draft.plan.layer(path) for path in unit.paths]
    named = [(e, w, layouts[w.name]) for e in entries for w in e.weights
             if layouts[w.name][0] is not None]
    if not any(pos is not None for _, _, (_, _, pos) in named):
        for entry in entries:
            draft.whole(entry, f"LayoutMap shards none of this {unit.kind}'s variables on "
                               f"{model_axis!r}")
        return
    for entry in entries:
        axes = [w.axis for w in entry.weights]
        kind, reasons = entry.kind, []
        for i, weight in enumerate(entry.weights):
            key, layout, pos = layouts[weight.name]
            if key is None:
                reasons.append(f"{weight.name.split('/')[-1]} follows its {unit.kind}")
                continue
            if pos == weight.axis:
                reasons.append(f"LayoutMap {key!r} {layout}")
                continue
            hidden = _hidden_axis(model, entry, unit)
            if weight.axis is not None and pos is not None and pos == hidden:
                kind, axes[i] = "hidden", pos
                axes = [a if w.name.split("/")[-1] == "kernel" else None
                        for a, w in zip(axes, entry.weights, strict=True)]
                reasons.append(f"LayoutMap {key!r} {layout}: by hidden units, heads after "
                               "the sum")
                continue
            why = "the engine keeps it whole" if weight.axis is None else \
                f"the engine splits it on dimension {weight.axis}"
            _refuse(weight, entry, key, layout, pos if pos is not None else -1, model_axis, why)
        draft.kinds[entry.name] = (kind, "; ".join(reasons), tuple(axes))
    draft.units.append(unit)


def _consumers(layer: Any) -> list[Any]:
    return [node.operation for node in layer._outbound_nodes]


def _producers(layer: Any) -> list[Any]:
    nodes = layer._inbound_nodes
    return [p.operation for p in nodes[0].parent_nodes] if nodes else []


def _dense_pairs(model: Any, draft: _Draft, loose: list[tuple[LayerSplit, WeightSplit, Any]],
                 shards: int, model_axis: str | None) -> None:
    """Top-level ``Dense`` layers the LayoutMap shards as column (kernel ``(None, model)``)
    and row (``(model, None)``): checked as pairs and added as feed-forward units."""
    columns: dict[str, Any] = {}
    rows: dict[str, Any] = {}
    for entry, weight, (key, layout, pos) in loose:
        layer = layer_at(model, entry.name)
        leaf = weight.name.split("/")[-1]
        top = "/" not in entry.name and type(layer).__name__ == "Dense" and \
            type(layer).__module__.startswith("keras.") and len(layer._inbound_nodes) == 1
        if not top or (leaf == "kernel" and pos not in (0, 1)) or \
                (leaf == "bias" and pos != 0) or leaf not in ("kernel", "bias"):
            _refuse(dataclasses.replace(weight, axis=None), entry, key, layout, pos,
                    model_axis, entry.reason)
        if leaf == "kernel":
            (columns if pos == 1 else rows)[entry.name] = layer
    for name, layer in columns.items():
        bad = [c.name for c in _consumers(layer) if c.name not in rows]
        if bad or not _consumers(layer):
            raise StrategyConfigError(format_error(
                f"LayoutMap shards Dense {name!r} by columns (kernel (None, {model_axis!r})), "
                "but what reads it is not sharded by rows: it would read one shard of the "
                "output as the whole.",
                received=f"{name} -> {bad or 'the model output'}",
                expected="every consumer of a column-sharded Dense sharded by rows",
                fix=f"layout_map['{bad[0] if bad else name}/kernel'] = ({model_axis!r}, None)"
                    if bad else f"layout_map['{name}/kernel'] = (None, None)"))
    for name, layer in rows.items():
        bad = [p.name for p in _producers(layer) if p.name not in columns]
        if bad:
            raise StrategyConfigError(format_error(
                f"LayoutMap shards Dense {name!r} by rows (kernel ({model_axis!r}, None)), but "
                "its input is not sharded by columns.",
                received=f"{bad} -> {name}", expected="a row-sharded Dense fed by column ones",
                fix=f"layout_map['{bad[0]}/kernel'] = (None, {model_axis!r})"))
    for name, layer in {**columns, **rows}.items():
        width = int(layer.kernel.shape[1 if name in columns else 0])
        if width % shards:
            raise StrategyConfigError(format_error(
                f"Dense {name!r} cannot be split {shards} ways: its sharded width {width} is "
                f"not a multiple of {shards}.", received=f"{name} width {width}, T={shards}",
                expected="a width divisible by the model axis", fix="change the width or T"))
        column = name in columns
        entry = draft.plan.layer(name)
        axes = tuple((1 if column else 0) if w.name.endswith("kernel") else
                     (0 if column else None) for w in entry.weights)
        draft.kinds[name] = ("column" if column else "row",
                             f"LayoutMap: Dense by {'columns' if column else 'rows'}", axes)
    for name in columns:
        draft.units.append(Unit("feed-forward", None, (name, *[
            c.name for c in _consumers(columns[name])])))


def plan_from_layout(model: Any, layout_map: Any, model_axis: str | None,
                     data_axis: str | None, shards: int, data_size: int = 1) -> LayoutPlan:
    """The tensor plan ``layout_map`` asks of ``model`` (built) at ``shards`` = T.

    Args:
        model: The whole model, built.
        layout_map: A ``keras.distribution.LayoutMap``.
        model_axis: The mesh's model axis name (None: a 1-D mesh, nothing split).
        data_axis: The batch axis name.
        shards: T (the model axis's size).
        data_size: D (the batch axis's size): over 1, weights the LayoutMap shards on the
            batch axis are noted as held whole per replica.

    Raises:
        StrategyConfigError: an entry matching no variable or several, a layout of the wrong
            rank, a sharding no split implements (the variable, its layout and the nearest
            that works), a column/row pair broken, or a width T does not divide.
    """
    plan, units = plan_nested(model, shards)
    weights = [w for e in plan.layers for w in e.weights]
    draft = _Draft(plan, notes=_check_entries(layout_map, [w.name for w in weights],
                                              [p for p, _ in walk(model)]))
    layouts: dict[str, tuple[str | None, Any, int | None]] = {}
    for weight in weights:
        key, axes = layout_of(layout_map, weight.name)
        pos = None if key is None else _model_position(weight.name, key, axes, weight.shape,
                                                       model_axis)
        layouts[weight.name] = (key, axes, pos)
        if key is not None and data_axis in axes and data_size > 1:
            draft.notes.append(f"{weight.name}: LayoutMap {key!r} {axes} also shards it over "
                               f"{data_axis!r}; held whole on each of the {data_size} data "
                               "replicas (tfdist does not shard weights over the data axis)")
    for unit in units:
        _unit(model, draft, unit, layouts, model_axis)
    in_units = {p for u in units for p in u.paths}
    loose = [(e, w, layouts[w.name]) for e in plan.layers if e.name not in in_units
             for w in e.weights if layouts[w.name][2] is not None]
    _dense_pairs(model, draft, loose, shards, model_axis)
    layers = []
    for entry in plan.layers:
        kind, reason, axes = draft.kinds.get(entry.name, (
            "replicated", "LayoutMap: not sharded" if any(layouts[w.name][0] is not None
                                                          for w in entry.weights)
            else entry.reason if not entry.split else "LayoutMap names none of it",
            tuple(None for _ in entry.weights)))
        layers.append(LayerSplit(entry.name, entry.class_name, kind, reason, tuple(
            dataclasses.replace(w, axis=a) for w, a in zip(entry.weights, axes, strict=True))))
    return LayoutPlan(TensorPlan(shards, tuple(layers)), tuple(draft.units), tuple(draft.notes))
