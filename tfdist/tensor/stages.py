"""Tensor parallelism inside pipeline stages (``K x T``): the tensor plan of a pipeline's whole
model, checked against its cuts, and each stage's layers split by it.

On a ``data x pipe x tensor`` mesh every pipeline stage is held by ``T`` processes. The whole
model is planned once (`tfdist.tensor.rules.plan_model`), each stage is built from its layers'
configs with the split layers made as their shard (`StageSplit.layer_maker`, handed to
`tfdist.pipeline.stage.build_stage`), so a process allocates only its shard of its stage. A cut
between stages then carries whole activations (row-split layers, attention and the vocabulary
embedding all-reduce their outputs), the same on every shard of a stage: stage ``k``'s shard
``t`` sends to stage ``k+1``'s shard ``t``, and gradients come back the same way.

Two things the tensor strategy does are not done across a cut, and the plan says so or refuses:

* a column-split ``Dense`` whose output a cut would carry (its row-split partner in the next
  stage) is refused: move the split point, or replicate the pair;
* the output ``Dense`` is not split by vocabulary (``output``): the last stage computes the
  pipeline's loss on whole logits. The automatic rules' choice becomes ``replicated``; a user
  rule asking for ``output`` is refused. A tied embedding (``tied``: KerasHub's
  ``ReversibleEmbedding``, the lookup in the first stage, the logits in the last) is split by
  vocabulary rows in both: the lookup as the tensor strategy's, the logits of this shard's
  columns gathered whole for the loss (`tfdist.parallel.mappings.gather_from_group`, an exact
  concatenation; backward, each shard takes its columns' gradient). The two stages' shards
  ``t`` hold the same rows, and their gradients are summed pairwise (`tfdist.pipeline.tied`).

Example:
    >>> import keras
    >>> from tfdist.pipeline import stage
    >>> inputs = keras.Input((4, 8))
    >>> up = keras.layers.Dense(16, name="up")(inputs)
    >>> down = keras.layers.Dense(8, name="down")(up)
    >>> model = keras.Model(inputs, keras.layers.LayerNormalization(name="ln")(down))
    >>> spec, bounds = stage.split_model(model, 2, split_points=["down"])
    >>> try:
    ...     check_cuts(spec, bounds, plan_stages(model, shards=2))
    ... except StrategyConfigError as err:
    ...     print(str(err)[:86])
    The cut before stage 1 (at layer 'down') would carry the output of layer 'up' (column)
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tfdist.errors import StrategyConfigError, format_error
from tfdist.parallel.keys import next_key
from tfdist.parallel.mesh import ProcessGroup
from tfdist.parallel.ops import DEFAULT_TIMEOUT, broadcast_variable
from tfdist.tensor import build as shards_of
from tfdist.tensor.nested import Unit, entry_variables, is_nested, plan_nested
from tfdist.tensor.plan import LOGIT_KINDS, LayerSplit, TensorPlan, check_coverage
from tfdist.tensor.rules import plan_model

_log = logging.getLogger("tfdist")

__all__ = ["plan_stages", "plan_stage_units", "check_cuts", "StageSplit", "stage_split",
           "check_clipping"]

_OUTPUT_WHOLE = "pipeline: the last stage's loss reads whole logits"
_TIED_GATHERED = "; pipeline: its logits gathered whole for the last stage's loss"
_CARRIED_SPLIT = ("column",)
"""Kinds whose output is one shard's columns, not the whole activation."""


def _replicated(layer: LayerSplit, reason: str) -> LayerSplit:
    weights = tuple(dataclasses.replace(w, axis=None) for w in layer.weights)
    return dataclasses.replace(layer, kind="replicated", reason=reason, weights=weights)


def plan_stages(model: Any, shards: int, rules: Mapping[str, str] | None = None) -> TensorPlan:
    """The tensor plan of a pipeline's whole ``model`` (built, or without weights): the
    automatic and user rules, with the vocabulary-split output ``Dense`` replicated (a tied
    embedding stays split; its logits are gathered whole). A model of blocks
    (a KerasHub model's Transformer layers) is planned through its layer tree
    (`tfdist.tensor.nested`): its entries are paths inside the blocks.

    Raises:
        StrategyConfigError: what `plan_model` refuses, or a rule asking for ``output``.
    """
    return plan_stage_units(model, shards, rules)[0]


def plan_stage_units(model: Any, shards: int, rules: Mapping[str, str] | None = None
                     ) -> tuple[TensorPlan, tuple[Unit, ...]]:
    """`plan_stages`'s plan and the units it splits inside blocks (none for a flat model)."""
    units: tuple[Unit, ...] = ()
    if is_nested(model):
        plan, units = plan_nested(model, shards, rules)
        logits = {layer.name for layer in plan.layers if layer.kind in LOGIT_KINDS}
        units = tuple(u for u in units if not logits & set(u.paths))
    else:
        plan = plan_model(model, shards, rules)
    layers = []
    for layer in plan.layers:
        if layer.kind == "tied":
            layers.append(dataclasses.replace(layer, reason=layer.reason + _TIED_GATHERED))
            continue
        if layer.kind in LOGIT_KINDS and layer.reason.startswith("rule"):
            raise StrategyConfigError(format_error(
                f"Layer {layer.name!r} cannot be split by vocabulary in a pipeline: the last "
                "stage computes the loss on whole logits.",
                received=f"rules: {layer.name!r} -> {layer.kind!r} ({layer.reason})",
                expected="'replicated' (or 'column' followed by a 'row' layer; a tied "
                "embedding may be 'tied')",
                fix=f"drop that rule, or use rules={{{layer.name!r}: 'replicated'}}"))
        layers.append(_replicated(layer, _OUTPUT_WHOLE) if layer.kind in LOGIT_KINDS else layer)
    return TensorPlan(plan.shards, tuple(layers)), units


def check_cuts(spec: Any, bounds: Sequence[int], plan: TensorPlan) -> None:
    """Raises when a cut between stages would carry a column-split layer's output (one
    shard's columns, which the next stage's row-split layer must read on the same shard).

    Args:
        spec: The whole model's `tfdist.pipeline.stage.ModelSpec`.
        bounds: Its stages' bounds.
        plan: `plan_stages`'s plan of it.
    """
    kinds = {layer.name: layer.kind for layer in plan.layers}
    producer = {t: node for node in spec.nodes for t in node.outputs}
    for k, cut in enumerate(spec.cuts(bounds)):
        for tensor in cut:
            node = producer.get(tensor)
            name = None if node is None else spec.layers[node.layer].name
            if kinds.get(name) in _CARRIED_SPLIT:
                first = spec.names[bounds[k + 1]]
                raise StrategyConfigError(format_error(
                    f"The cut before stage {k + 1} (at layer {first!r}) would carry the output "
                    f"of layer {name!r} ({kinds[name]}), which is split by columns: its "
                    "row-split partner must be in the same stage.",
                    received=f"split_points / stage {k + 1} starting at {first!r}",
                    expected=f"a cut that does not separate {name!r} from the layer that "
                    "reads it",
                    fix=f"move the split point before {name!r} or after its partner, or "
                    f"replicate the pair: rules={{{name!r}: 'replicated', ...}}"))


def check_clipping(optimizer: Any) -> None:
    """Raises for norm clipping, which would take the norms of a shard's slices only.

    Example:
        >>> import keras
        >>> check_clipping(keras.optimizers.Adam())
    """
    for option in ("clipnorm", "global_clipnorm"):
        value = getattr(optimizer, option, None)
        if value:
            raise StrategyConfigError(format_error(
                f"{option} is not supported with tensor-split pipeline stages: a stage's "
                "shard would clip by the norm of its own slices.",
                received=f"{option}={value}", expected=f"{option}=None",
                fix=f"drop {option} (clipvalue is exact), or use --tensor 1 or "
                "--strategy tensor"))


@dataclasses.dataclass(frozen=True)
class StageSplit:
    """How this process's stage is split: the whole model's plan and its tensor group.

    Attributes:
        plan: `plan_stages`'s plan of the whole model.
        group: This stage's tensor group (the processes holding its shards).
        timeout: Seconds an eager collective of the split layers waits.
        units: What the plan splits inside blocks (`plan_stage_units`): such a block is built,
            given its weights and shared whole, then sharded in place (`shard_blocks`).
    """

    plan: TensorPlan
    group: ProcessGroup
    timeout: float
    units: tuple[Unit, ...] = ()

    def layer_maker(self, keras: Any, layer: Any) -> Any:
        """The layer a stage is built with for ``layer`` (a
        `tfdist.pipeline.stage.LayerSpec`): its shard when the plan splits it, else a copy."""
        from tfdist.pipeline.stage import rebuild_layer

        whole = rebuild_layer(keras, layer)
        found = self.split_of(layer.name)
        if found is None or self.group.size == 1:
            return whole
        made = shards_of.split_layer(whole, found, self.group, self.timeout)
        if found.kind == "tied":
            made.whole_logits = True  # the last stage's loss reads whole logits
        return made

    def split_of(self, name: str) -> LayerSplit | None:
        found = next((layer for layer in self.plan.layers if layer.name == name), None)
        return found if found is not None and found.split else None

    def of_layers(self, names: Sequence[str]) -> TensorPlan:
        """The plan restricted to the layers ``names`` (a stage's) and the paths inside them."""
        wanted = set(names)
        return TensorPlan(self.plan.shards, tuple(
            layer for layer in self.plan.layers
            if layer.name in wanted or layer.name.split("/")[0] in wanted))

    def held_bytes(self, name: str, whole: int) -> int:
        """Bytes of layer ``name``'s weights (``whole`` of them) a shard holds."""
        inside = self.of_layers([name]).layers
        if not inside:
            return whole
        return sum(w.bytes_per_process(self.plan.shards) for layer in inside
                   for w in layer.weights)

    def shard_blocks(self, model: Any, spec: Any, layer_ids: Sequence[int]) -> None:
        """Makes the blocks among layers ``layer_ids`` of a stage (holding their whole,
        agreed weights) this process's shard in place (`tfdist.tensor.inplace`)."""
        if not self.units or self.group.size == 1:
            return
        from tfdist.tensor.inplace import shard_in_place

        blocks = {spec.layers[lid].name for lid in layer_ids}
        mine = tuple(u for u in self.units if u.paths[0].split("/")[0] in blocks)
        paths = {path for u in mine for path in u.paths}
        plan = TensorPlan(self.plan.shards,
                          tuple(layer for layer in self.plan.layers if layer.name in paths))
        with _where_made(model):
            shard_in_place(model, plan, mine, self.group, self.timeout)

    def set_weights(self, model: Any, spec: Any, layer_ids: Sequence[int],
                    weights: Sequence[Any]) -> None:
        """Sets layers ``layer_ids`` of a stage from the whole model's ``weights`` (in
        `tfdist.pipeline.stage.layer_weights` order): this shard's slices of the split ones."""
        rest = list(weights)
        for lid in layer_ids:
            layer = spec.layers[lid]
            count = len(layer.weights)
            model.get_layer(layer.name).set_weights(self._shard(layer.name, rest[:count]))
            rest = rest[count:]

    def _shard(self, name: str, weights: Sequence[Any]) -> list[Any]:
        found = self.split_of(name)
        if found is None:
            return list(weights)
        return [shards_of.piece(np.asarray(v), w.axis, self.group.rank, self.plan.shards)
                for v, w in zip(weights, found.weights, strict=True)]

    def gather(self, model: Any, spec: Any, layer_ids: Sequence[int]) -> list[np.ndarray]:
        """The whole weights of layers ``layer_ids`` of a stage, in
        `tfdist.pipeline.stage.layer_weights` order (a collective of the tensor group)."""
        names = [spec.layers[lid].name for lid in layer_ids]
        plan = self.of_layers(names)
        whole = shards_of.gather_weights(model, plan, self.group, self.timeout)
        by_id = {id(v): value for layer in plan.layers if "/" in layer.name
                 for v, value in zip(entry_variables(model, layer), whole[layer.name],
                                     strict=True)}
        out = []
        for name in names:
            if name in whole:
                out.extend(np.asarray(w) for w in whole[name])
            elif any(layer.name.startswith(name + "/") for layer in plan.layers):
                out.extend(np.asarray(by_id[id(v)]) for v in model.get_layer(name).weights)
        return out

    def share_replicated(self, model: Any, layer_ids: Sequence[int], spec: Any) -> None:
        """Gives every shard shard 0's values of the weights held whole (a collective)."""
        for lid in layer_ids:
            name = spec.layers[lid].name
            found = self.split_of(name)
            for i, variable in enumerate(model.get_layer(name).weights):
                if found is None or found.weights[i].axis is None:
                    broadcast_variable(variable, group=self.group,
                                       instance=next_key(self.group.key), timeout=self.timeout)


def _where_made(model: Any) -> Any:
    """The distribution strategy's scope and the device ``model``'s variables were made in:
    the shards' new variables are made there too (an optimizer refuses slots for a variable
    from another strategy)."""
    import contextlib

    import tensorflow as tf

    stack = contextlib.ExitStack()
    first = next(iter(model.weights), None)
    value = getattr(first, "value", first)
    strategy = getattr(value, "_distribute_strategy", None)
    if strategy is not None:
        stack.enter_context(strategy.scope())
    if getattr(value, "device", None):
        stack.enter_context(tf.device(value.device))
    return stack


def stage_split(spec: Any, bounds: Sequence[int], rules: Mapping[str, str],
                group: ProcessGroup, timeout: float | None = None) -> StageSplit:
    """The `StageSplit` of a pipeline's model on ``group`` (this stage's tensor group): the
    whole model planned for ``group.size`` shards (`plan_stages`), its cuts checked.

    Raises:
        StrategyConfigError: a tf-keras model, what `plan_stages` and `check_cuts` refuse.
    """
    if spec.flavour != "keras3":
        raise StrategyConfigError(format_error(
            "Tensor-split pipeline stages need Keras 3 (the split layers subclass its Dense, "
            "Embedding and MultiHeadAttention).",
            received=f"tensor={group.size} with a {spec.flavour} model",
            expected="a Keras 3 model", fix="unset TF_USE_LEGACY_KERAS, or use --tensor 1"))
    from tfdist.compat import models as keras_compat
    from tfdist.pipeline import stage

    with keras_compat.abstract_build():
        whole = stage.assemble(spec)
    plan, units = plan_stage_units(whole, group.size, rules)
    timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    if units and group.size > 1:
        plan, units = _checked(stage.assemble(spec), plan, units, group, timeout)
    warning = check_coverage(plan, repr(spec.name))
    if warning and group.members[0] == 0:  # the chief's tensor group: said once
        _log.warning("%s\n%s", warning, plan.table())
    check_cuts(spec, bounds, plan)
    return StageSplit(plan, group, timeout, units)


def _checked(whole: Any, plan: TensorPlan, units: tuple[Unit, ...], group: ProcessGroup,
             timeout: float) -> tuple[TensorPlan, tuple[Unit, ...]]:
    """``plan`` with each block whose split differs from it whole kept whole
    (`tfdist.tensor.blocks.checked_plan` on ``whole``, the model with drawn weights; the
    group's largest gap decides, so every shard keeps the same blocks whole)."""
    import tensorflow as tf

    from tfdist.parallel.mappings import all_reduce_max
    from tfdist.tensor.blocks import checked_plan

    def agree(values: np.ndarray) -> np.ndarray:
        return all_reduce_max(tf.constant(values), group, timeout).numpy()

    plan, units, _ = checked_plan(whole, plan, units, agree)
    return plan, units
