"""The whole model's weights on the chief: each stage of replica 0 sends the weights of the layers
it owns over its pair link to stage 0 (the chief), which puts them in the whole model's order.

A process holds one piece of the model (a plain pipeline: its stage) or several (interleaved:
pieces ``k, k + K, ...``, `tfdist.pipeline.interleave.pieces`); the chief orders what it
receives by piece either way. Transfers use the ``WEIGHTS`` instance keys of
`tfdist.pipeline.transport`, one per weight in the order the sender holds them, each sized
(`tfdist.parallel.ops.sized_broadcast`): a job that gathers two models reuses the keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist.pipeline import interleave, stage, transport
from tfdist.pipeline.layout import PipelineLayout

__all__ = ["gather_pieces", "gather_stages", "weight_shapes"]


def weight_shapes(spec: stage.ModelSpec, bounds: Sequence[int],
                  piece: int) -> list[tuple[Any, Any]]:
    """``(shape, dtype)`` of each weight of the layers ``piece`` owns, in the model's order."""
    return [w for lid in stage.owned_layers(spec, bounds, piece) for w in spec.layers[lid].weights]


def gather_stages(own: list[np.ndarray], spec: stage.ModelSpec, bounds: Sequence[int],
                  layout: PipelineLayout, timeout: float) -> list[np.ndarray] | None:
    """Every stage's weights on stage 0 (the whole model's order), None on the others; ``own``
    is this stage's. A collective of replica 0's stages, one piece each."""
    if layout.stage != 0:
        _send_to_stage_0(own, layout, timeout)
        return None
    weights = list(own)
    for k in range(1, layout.stages):
        weights += _receive(k, weight_shapes(spec, bounds, k), layout, timeout)
    return weights


def gather_pieces(own: list[np.ndarray], spec: stage.ModelSpec, bounds: Sequence[int],
                  layout: PipelineLayout, chunks: int, timeout: float) -> list[np.ndarray] | None:
    """`gather_stages` when each process holds ``chunks`` pieces (interleaved); ``own`` is this
    process's pieces' weights, piece after piece."""
    if layout.stage != 0:
        _send_to_stage_0(own, layout, timeout)
        return None
    per_piece: dict[int, list[np.ndarray]] = {}
    for k in range(layout.stages):
        shapes = [(p, w) for p in interleave.pieces(layout.stages, chunks, k)
                  for w in weight_shapes(spec, bounds, p)]
        received = own if k == 0 else _receive(k, [w for _, w in shapes], layout, timeout)
        for (p, _), w in zip(shapes, received, strict=True):
            per_piece.setdefault(p, []).append(w)
    return [w for p in sorted(per_piece) for w in per_piece[p]]


def _send_to_stage_0(weights: list[np.ndarray], layout: PipelineLayout, timeout: float) -> None:
    link = transport.Link(layout.pair(layout.rank_of(0, 0)), timeout)
    for i, w in enumerate(weights):
        link.send_sized(tf.constant(w), transport.WEIGHTS, 0, i)


def _receive(stage_index: int, shapes: list[tuple[Any, Any]], layout: PipelineLayout,
             timeout: float) -> list[np.ndarray]:
    link = transport.Link(layout.pair(layout.rank_of(0, stage_index)), timeout)
    return [link.recv_sized(tf.constant(shape, tf.int32), tf.as_dtype(dtype), transport.WEIGHTS,
                            0, i).numpy()
            for i, (shape, dtype) in enumerate(shapes)]
