"""Weights tied across stages: a layer called by several stages (an output projection that reuses
the input embedding) lives once on each stage that calls it.

Each holder computes its own gradient of the shared weight (from its own calls); the gradients
are summed across the holders before the optimizer step, so every copy gets the same update, the
one a single device gives the one weight. The copies start equal: the built model's weights are
copied to every holder, and a build function's are sent from the first holder to the others.

Example:
    >>> from tfdist.core.flavour import get_keras
    >>> from tfdist.pipeline import stage
    >>> keras = get_keras()
    >>> x = keras.Input((3,))
    >>> dense = keras.layers.Dense(3, name="shared")
    >>> out = dense(keras.layers.Dense(3, name="mid")(dense(x)))
    >>> spec = stage.describe_model(keras.Model(x, out))
    >>> shared_layers(spec, (0, 1, 3))
    {0: (0, 1)}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tfdist.errors import StrategyConfigError, format_error
from tfdist.parallel.keys import TIED, instance_key
from tfdist.parallel.mesh import ProcessGroup
from tfdist.parallel.ops import all_reduce, broadcast_variable
from tfdist.pipeline import stage as stages
from tfdist.pipeline.layout import PipelineLayout

__all__ = ["shared_layers", "check_clipping", "TiedWeights", "tied_for_stage", "tied_for_local"]

Sum = Callable[[list[Any]], list[Any]]


def shared_layers(spec: stages.ModelSpec, bounds: Sequence[int]) -> dict[int, tuple[int, ...]]:
    """The layers that more than one stage calls, each with the stages that call it."""
    holders: dict[int, list[int]] = {}
    for k in range(len(bounds) - 1):
        for lid in stages.stage_layers(spec, bounds, k):
            holders.setdefault(lid, []).append(k)
    return {lid: tuple(ks) for lid, ks in holders.items() if len(ks) > 1}


def check_clipping(optimizer: Any, spec: stages.ModelSpec, bounds: Sequence[int]) -> None:
    """Refuses ``global_clipnorm`` when a weight is tied across stages: each holder's copy has the
    summed gradient, so a norm over the stages would count it once per holder, not once.

    Raises:
        StrategyConfigError: naming ``global_clipnorm``, the shared layers and the fixes.
    """
    limit = getattr(optimizer, "global_clipnorm", None)
    shared = shared_layers(spec, bounds) if limit else {}
    if shared:
        names = [spec.layers[lid].name for lid in sorted(shared)]
        raise StrategyConfigError(format_error(
            "global_clipnorm would count a weight tied across stages once per stage holding it "
            "(one device's norm counts it once): not exact.",
            received=f"global_clipnorm={limit} with {names} held by several stages",
            expected="no global_clipnorm, or no weight shared across stages",
            fix="use clipnorm (per variable, exact), or split_points that keep each shared "
                "layer's calls in one stage"))


def _positions(model: Any, name: str, variables: Sequence[Any]) -> list[int]:
    """Where ``model``'s layer ``name``'s trainable weights sit in ``variables``."""
    ids = {id(v): i for i, v in enumerate(variables)}
    return [ids[id(w)] for w in model.get_layer(name).trainable_weights]


@dataclasses.dataclass(frozen=True)
class TiedWeights:
    """One stage process's tied variables and the holder pair each is summed with.

    Attributes:
        entries: ``(position in the stage's trainable variables, pair group, instance index)``.
        timeout: Seconds each transfer may wait.
    """

    entries: tuple[tuple[int, ProcessGroup, int], ...]
    timeout: float = 0.0

    def __call__(self, grads: list[Any]) -> list[Any]:
        """``grads`` with each tied variable's gradient summed over its holders."""
        grads = list(grads)
        for position, group, index in self.entries:
            grads[position] = all_reduce(
                tf.convert_to_tensor(grads[position]), group, "sum",
                instance=instance_key(TIED, 0, index), timeout=self.timeout)
        return grads

    def sync(self, variables: Sequence[Any]) -> None:
        """Gives every holder the first holder's values (the lower rank of each pair sends)."""
        for position, group, index in self.entries:
            broadcast_variable(
                variables[position], group=group,
                instance=instance_key(TIED, 1, index), timeout=self.timeout)


def tied_for_stage(spec: stages.ModelSpec, bounds: Sequence[int], layout: PipelineLayout,
                   model: Any, timeout: float = 0.0) -> TiedWeights:
    """The tied variables of this process's stage (``model``).

    Raises:
        StrategyConfigError: a layer called by more than two stages (its sum would need a group
            of them; only pairs are supported between processes).
    """
    entries = []
    index = 0
    variables = list(model.trainable_variables)
    for lid, holders in sorted(shared_layers(spec, bounds).items()):
        layer = spec.layers[lid]
        if len(holders) > 2:
            raise StrategyConfigError(format_error(
                f"Layer {layer.name!r} is called by stages {list(holders)}: weights tied across "
                "more than two stages are not supported between processes.",
                received=f"{layer.name!r} in stages {list(holders)}",
                expected="a layer shared by at most two stages",
                fix="choose split_points that keep its calls within two stages"))
        if layout.stage in holders:
            peer = holders[1] if holders[0] == layout.stage else holders[0]
            group = layout.pair(layout.rank_of(layout.replica, peer))
            positions = _positions(model, layer.name, variables)
            entries.extend((p, group, index + i) for i, p in enumerate(positions))
        index += len(layer.weights)
    return TiedWeights(tuple(entries), timeout)


def tied_for_local(spec: stages.ModelSpec, bounds: Sequence[int],
                   models: Sequence[Any]) -> tuple[Sum, Callable[[], None]]:
    """For one process holding every stage (``models``): the gradient sum over the whole
    model's flat variable list, and the initial sync (the first holder's values copied)."""
    offsets, variables = [], []
    for model in models:
        offsets.append(len(variables))
        variables.extend(model.trainable_variables)
    groups = []
    for lid, holders in shared_layers(spec, bounds).items():
        name = spec.layers[lid].name
        per_stage = [[offsets[k] + p for p in _positions(models[k], name,
                                                           models[k].trainable_variables)]
                     for k in holders]
        groups.extend(zip(*per_stage, strict=True))

    def summed(grads: list[Any]) -> list[Any]:
        grads = list(grads)
        for positions in groups:
            total = tf.add_n([tf.convert_to_tensor(grads[p]) for p in positions])
            for p in positions:
                grads[p] = total
        return grads

    def sync() -> None:
        for first, *others in groups:
            for p in others:
                variables[p].assign(variables[first])

    return summed, sync
