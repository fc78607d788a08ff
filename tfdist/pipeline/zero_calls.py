"""Where a pipeline stage model meets ZeRO stage 3 on its data axis
(`tfdist.zero.data_axis_layers.DataAxisLayers`, kept as the stage model's ``_pipeline_zero``):
its weights hold no values between steps, so the consistency checks skip them, its calls gather
layer by layer, and what reads them whole gathers them first."""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["layered_zero", "checked_variables", "layer_gathers", "whole_weights"]


def layered_zero(model: Any) -> Any | None:
    """The model's ZeRO stage 3 (`tfdist.zero.data_axis_layers.DataAxisLayers`: its weights
    sharded, gathered layer by layer), or None."""
    zero = getattr(model, "_pipeline_zero", None)
    return zero if getattr(zero, "stage", 0) == 3 else None


def checked_variables(model: Any) -> list[Any]:
    """The weights the replicas of a stage compare each few steps: none under ZeRO stage 3
    (each holds its own part; the stage model's variables hold no values)."""
    return [] if layered_zero(model) is not None else list(model.trainable_variables)


def layer_gathers(model: Any) -> Any:
    """Under ZeRO stage 3, each layer gathers its weights for its calls while entered."""
    layered = layered_zero(model)
    return contextlib.nullcontext() if layered is None else layered.layerwise()


def whole_weights(model: Any) -> Any:
    """Under ZeRO stage 3, the stage's weights whole while entered (a collective of the
    stage's replicas)."""
    layered = layered_zero(model)
    return contextlib.nullcontext() if layered is None else layered.whole()
