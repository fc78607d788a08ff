"""A pipeline step's consistency checks: the same global batch on every process of the job (every
step), the same weights on every data replica of a stage (step 1, then every few steps).

Stage 0 reads ``x`` and the last stage ``y``: a pipeline whose stages read different data (an
unseeded shuffle, files read per process) trains one stage's inputs against another's targets
without a sign (measured: loss 4.70 against 0.036). Every process reads the whole global batch,
so each fingerprints all of it (`tfdist.parallel.consistency`) and the job compares them; the
replicas of a stage compare their weights, which their averaged gradients keep equal. Both
all-gathers run on named keys of the `CHECK` phase (`tfdist.parallel.keys`).

Example:
    >>> from tfdist.pipeline.layout import PipelineLayout
    >>> describe_rank(PipelineLayout(processes=4, rank=0, stages=2), 3)
    'rank 3 (stage 1 of replica 1)'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfdist.parallel import consistency
from tfdist.parallel.keys import CHECK, REDUCE, WEIGHTS, instance_key
from tfdist.parallel.mesh import DATA
from tfdist.pipeline.layout import PipelineLayout

__all__ = ["describe_rank", "step_checks", "gated"]

WEIGHTS_FIX = ("The data replicas of a pipeline stage average their gradients, so their weights "
               "stay equal unless they were changed on some processes only (set_weights, a "
               "restore or an assign on one process) or drew random numbers outside a layer's "
               "seed generator. Fix: change weights on every process alike, and build the model "
               "with strategy.build_model on every process")


def describe_rank(layout: PipelineLayout, rank: int) -> str:
    """A job rank's name in the checks' messages: its stage and replica (and shard)."""
    place = layout.mesh.coordinates(rank)
    first = place.pipe * (layout.stages // layout.mesh.pipe)
    shard = f", shard {place.tensor}" if layout.tensor > 1 else ""
    return f"rank {rank} (stage {first} of replica {place.data}{shard})"


def _named(variables: Any) -> dict[str, Any]:
    named: dict[str, Any] = {}
    for i, variable in enumerate(variables):
        name = str(getattr(variable, "path", None) or variable.name)
        named[name if name not in named else f"{name}#{i}"] = variable
    return named


def step_checks(layout: PipelineLayout, variables: Any, x: Any, y: Any,
                sample_weight: Any, step: Any, timeout: float,
                every: int | None = None) -> list[Any]:
    """The assertions of one training step (inside its ``tf.function``), on the global batch
    (``x``, ``y``, ``sample_weight`` before a replica takes its rows) and on this process's
    ``variables`` (its model's ``trainable_variables``, every chunk's); ``every`` is the
    weight check's interval (None: `consistency.check_every`)."""
    describe: Callable[[int], str] = lambda rank: describe_rank(layout, rank)  # noqa: E731
    checks = consistency.assert_agree(
        {"x": x, "y": y, "sample_weight": sample_weight}, layout.world(), step,
        subject="global batch", fix=consistency.BATCH_FIX, describe=describe,
        instance=instance_key(REDUCE, 0, 0, CHECK), timeout=timeout)
    every = consistency.check_every() if every is None else every
    if layout.group(DATA).size == 1:  # no replicas to compare: no cond traced
        return checks

    def weights() -> list[Any]:
        return consistency.assert_agree(
            _named(variables), layout.group(DATA), step,
            subject="weights of the replicas of a stage",
            fix=WEIGHTS_FIX, describe=describe, instance=instance_key(WEIGHTS, 0, 0, CHECK),
            timeout=timeout, tolerance=consistency.WEIGHT_TOLERANCE)

    return checks + consistency.when_due(step, every, weights)


def gated(checks: list[Any], *values: Any) -> tuple[Any, ...]:
    """``values`` (tensors or structures, None kept) computed after ``checks``: a step that
    reads them runs only on batches and weights that agree."""
    with tf.control_dependencies(checks):
        return tuple(None if value is None else tf.nest.map_structure(tf.identity, value)
                     for value in values)
