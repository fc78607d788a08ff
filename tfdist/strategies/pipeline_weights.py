"""Reading a pipeline's stages back: what a process holds (`StageWeightsMixin.stage_report`),
and the whole model's weights gathered on the chief (`gather_weights`, `assemble`).

`PipelineStrategy` (`tfdist.strategies.pipeline`) mixes it in; it reads the strategy's split
model (``spec``, ``bounds``), its mode and layout, and its tensor split.

Example:
    >>> import numpy as np
    >>> from tfdist.core import flavour
    >>> from tfdist.strategies.pipeline import PipelineStrategy
    >>> keras = flavour.get_keras()
    >>> strategy = PipelineStrategy()
    >>> model = strategy.build_model(lambda: keras.Sequential(
    ...     [keras.Input((2,)), keras.layers.Dense(1, name="a")]))
    >>> strategy.stage_report()["layers"], len(strategy.gather_weights(model))
    (['a'], 2)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tfdist.errors import StrategyConfigError, format_error
from tfdist.pipeline import gather, stage

__all__ = ["StageWeightsMixin", "stage_model"]


def stage_model(model: Any, k: int) -> Any:
    """Stage ``k``'s model: ``model`` itself, or its ``k``-th when it holds every stage."""
    stages = getattr(model, "pipeline_stages", None)
    return model if stages is None else stages[k]


class StageWeightsMixin:
    """What a process of a `PipelineStrategy` holds, and the whole model's weights."""

    spec: stage.ModelSpec | None
    bounds: tuple[int, ...] | None
    split: Any

    def stage_report(self) -> dict[str, Any]:
        """What this stage holds: layers and parameter bytes (this shard's, when split),
        against the whole model."""
        if self.spec is None or self.bounds is None:
            raise StrategyConfigError(format_error(
                "No model yet.", received="stage_report() before build_model()",
                expected="build_model() first", fix="call strategy.build_model(...)"))
        held = self.mode.pieces
        layers = [lid for k in held for lid in stage.stage_layers(self.spec, self.bounds, k)]
        layers = list(dict.fromkeys(layers))
        return {
            "stage": self.layout.stage, "pieces": list(held), "stages": self.stages,
            "replica": self.layout.replica,
            "devices": list(self.devices),
            "layers": [self.spec.layers[lid].name for lid in layers],
            "param_bytes": int(sum(self._held_bytes(lid) for lid in layers)),
            "shard": self.layout.coordinates.tensor, "shards": self.shards,
            "model_param_bytes": self.spec.total_param_bytes,
            "largest_layer_bytes": max(self.spec.param_bytes),
            "bounds": list(self.bounds),
        }

    def _held_bytes(self, layer_id: int) -> int:
        """Bytes of layer ``layer_id``'s weights this process holds (its shard's, when split)."""
        assert self.spec is not None
        layer = self.spec.layers[layer_id]
        if self.split is None:
            return layer.param_bytes
        return self.split.held_bytes(layer.name, layer.param_bytes)

    def gather_weights(self, model: Any) -> list[np.ndarray] | None:
        """All stages' weights (replica 0) on the chief, in the whole model's order; None
        elsewhere. A collective of replica 0's stages (other replicas return at once; under
        ZeRO stage 3 every replica first gathers its stage whole)."""
        from tfdist.pipeline.zero_calls import whole_weights

        with whole_weights(model):
            return self._gather_stages(model)

    def _gather_stages(self, model: Any) -> list[np.ndarray] | None:
        layout = self.layout
        if layout.replica != 0:
            return None
        assert self.spec is not None and self.bounds is not None
        spec, bounds = self.spec, self.bounds
        if layout.holds_all:
            if self.split is None:
                return [np.asarray(w) for k in range(layout.stages) for w in stage.layer_weights(
                    stage_model(model, k), spec, stage.owned_layers(spec, bounds, k))]
            # each stage is a shard: gather it whole from the tensor group (shard 0 keeps it)
            whole = [w for k in range(layout.stages) for w in self.split.gather(
                stage_model(model, k), spec, stage.owned_layers(spec, bounds, k))]
            return whole if layout.coordinates.tensor == 0 else None
        if self.config.chunks > 1:
            own = [np.asarray(w) for i, k in enumerate(self.mode.pieces) for w in
                   stage.layer_weights(stage_model(model, i), spec,
                                       stage.owned_layers(spec, bounds, k))]
            return gather.gather_pieces(own, spec, bounds, layout, self.config.chunks,
                                        self.timeout)
        owned = stage.owned_layers(spec, bounds, layout.stage)
        if self.split is None:
            own = [np.asarray(w) for w in stage.layer_weights(model, spec, owned)]
        else:  # a collective of the stage's shards; shard 0 sends the whole weights
            own = self.split.gather(model, spec, owned)
            if layout.coordinates.tensor != 0:
                return None
        return gather.gather_stages(own, spec, bounds, layout, self.timeout)

    def assemble(self, model: Any) -> Any | None:
        """The whole model with the trained weights on the chief, None elsewhere (collective)."""
        weights = self.gather_weights(model)
        if weights is None or not self.is_chief:
            return None
        assert self.spec is not None
        return stage.assemble(self.spec, weights)
