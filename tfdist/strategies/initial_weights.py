"""A model-parallel strategy's initial weights from a build function: each process's parts of
what one process draws for the same function and seed (`tfdist.pipeline.initial`).

Both strategies described the whole model without weights first (`keras_compat.abstract_build`),
which left each weight's initializer holding the seed a one-process build gives it. Here every
process of the job takes the first process's seeds (so an unseeded build is one model too), then
draws its own layers' weights one at a time: a weight split over a tensor group is drawn whole and
sliced, as Megatron-LM does. Weights whose initializer cannot be replayed are named in a warning
on the chief (`initial.log_notes`) and kept consistent: whole ones are copied from the first
holder by the strategy afterwards, split ones drawn whole by the group's first process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tfdist.pipeline import initial, stage

__all__ = ["stages_drawn_when_made", "stages_initial_weights", "shard_initial_weights"]


def _axes_of(split_of: Callable[[str], Any]) -> Callable[[str], list[int | None] | None]:
    """The split axes of a layer's weights from a plan lookup (None: not split)."""
    def axes(name: str) -> list[int | None] | None:
        found = split_of(name)
        return None if found is None or not found.split else [w.axis for w in found.weights]

    return axes


def _stage_draws(spec: stage.ModelSpec) -> dict[str, Any]:
    return {layer.name: layer.draws for layer in spec.layers}


def _split_axes(strategy: Any) -> dict[str, Any]:
    """How the stages' layers are split over the tensor group (``{}``: not split)."""
    split = strategy.split
    if split is None:
        return {}
    return {"axes": _axes_of(split.split_of), "group": split.group}


def stages_drawn_when_made(strategy: Any, spec: stage.ModelSpec) -> Any:
    """Gives every process the first process's seeds (a collective of the job), then returns
    the context in which a `PipelineStrategy` builds its stages: each weight made from its part
    of the one-process draw (`initial.drawn_when_made`), so none is drawn twice and a stage
    holds its weights plus one weight's draw at most."""
    draws = _stage_draws(spec)
    initial.agree_seeds([d for found in draws.values() for d in found],
                        strategy.layout.world(), strategy.timeout)
    return initial.drawn_when_made(draws, **_split_axes(strategy))


def stages_initial_weights(strategy: Any, model: Any, spec: stage.ModelSpec,
                           bounds: Sequence[int]) -> list[str]:
    """Gives this process's stages (or pieces, or shards of its stage) of a `PipelineStrategy`
    their parts of the one-process draw, those not drawn when made (built inside
    `stages_drawn_when_made`, which agreed the seeds); returns the plan's notes (weights drawn
    otherwise)."""
    del bounds  # each stage model holds its layers; the draws are found by name
    draws = _stage_draws(spec)
    how = _split_axes(strategy)
    stages = getattr(model, "pipeline_stages", None) or [model]
    for piece in stages:
        initial.initialise_layers(piece, draws, timeout=strategy.timeout, **how)
    return initial.log_notes(draws) if strategy.is_chief else initial.notes(draws)


def shard_initial_weights(strategy: Any, model: Any, abstract: Any) -> list[str]:
    """Gives this process's shard of a `TensorStrategy` model its slices of the one-process
    draw of ``abstract`` (the whole model built without weights); returns the plan's notes."""
    plan = strategy.plan
    draws = {layer.name: initial.record(abstract.get_layer(layer.name))
             for layer in plan.layers}
    initial.agree_seeds([d for found in draws.values() for d in found],
                        strategy.place.world(), strategy.timeout)
    splits = {layer.name: layer for layer in plan.layers}
    initial.initialise_layers(model, draws, _axes_of(splits.get), strategy.tensor_group,
                              strategy.timeout)
    return initial.log_notes(draws) if strategy.is_chief else initial.notes(draws)
