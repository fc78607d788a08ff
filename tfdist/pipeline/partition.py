"""Where a model is split into stages: given split points, or balanced by cost. Pure functions.

A partition is a tuple of K+1 layer indices ``bounds``: stage ``k`` holds layers
``bounds[k]:bounds[k+1]`` (input layers excluded: index 0 is the model's first real layer).

Example:
    >>> balanced_bounds([1, 1, 1, 1, 4], stages=2)
    (0, 4, 5)
    >>> bounds_from_split_points(["a", "b", "c"], ["b"], stages=2)
    (0, 1, 3)
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from tfdist.errors import StrategyConfigError, format_error

__all__ = [
    "check_stages",
    "check_micro_batches",
    "bounds_from_split_points",
    "balanced_bounds",
    "check_layer_costs",
    "read_layer_costs",
    "stage_costs",
    "crossing",
    "cut_bytes",
    "check_layer_classes",
    "check_added_losses",
    "UNSUPPORTED_LAYERS",
    "BATCH_NORM_FIX",
    "MAX_MICRO_BATCHES",
]

MAX_MICRO_BATCHES = 1024
"""The most micro-batches a step may have (its graph holds 2 ops per micro-batch per stage)."""

UNSUPPORTED_LAYERS: Mapping[str, str] = {
    "BatchNormalization": "its batch statistics would be computed per micro-batch, so training "
    "would differ from one device on the whole batch",
}
"""Layer classes a pipeline refuses when ``micro_batches > 1``, with the reason."""

BATCH_NORM_FIX = (
    "use micro_batches=1, LayerNormalization/GroupNormalization instead, or accept GPipe's "
    "per-micro-batch statistics: tfdist.get_strategy(..., batch_norm='per_micro_batch'), or "
    "tfdist-launch --batch-norm per_micro_batch (TFDIST_PIPELINE_BATCH_NORM=per_micro_batch)")
"""The fix both refusals (the split's and a built stage's) name: the micro-batch count, another
normalisation, or the opt-in by its argument, its launcher flag and its variable."""


def check_stages(stages: object, num_layers: int | None = None) -> int:
    """Returns ``stages`` if it is an int >= 1 (and at most ``num_layers``), else raises.

    Example:
        >>> check_stages(2, num_layers=3)
        2
    """
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise StrategyConfigError(format_error(
            "stages must be a positive int.", received=f"stages={stages!r}",
            expected="an int >= 1 (the number of pipeline stages, K)",
            fix="pass stages=2 (or tfdist-launch --stages 2)"))
    if num_layers is not None and stages > num_layers:
        raise StrategyConfigError(format_error(
            f"The model has {num_layers} layer(s), fewer than the {stages} stages asked for.",
            received=f"stages={stages}, layers={num_layers}",
            expected=f"stages <= {num_layers} (each stage holds at least one layer)",
            fix=f"use stages={num_layers} or fewer, or a deeper model"))
    return stages


def check_micro_batches(micro_batches: object, batch: int | None = None) -> int:
    """Returns ``micro_batches`` if it is an int >= 1 dividing ``batch``, else raises.

    Example:
        >>> check_micro_batches(4, batch=32)
        4
    """
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise StrategyConfigError(format_error(
            "micro_batches must be a positive int.", received=f"micro_batches={micro_batches!r}",
            expected="an int >= 1 (micro-batches per replica batch, M)",
            fix="pass micro_batches=4 (or tfdist-launch --micro-batches 4)"))
    if micro_batches > MAX_MICRO_BATCHES:
        raise StrategyConfigError(format_error(
            f"micro_batches={micro_batches} is more than a pipeline step can schedule: each "
            "micro-batch is a forward and a backward op per stage in the step's graph.",
            received=f"micro_batches={micro_batches}",
            expected=f"at most {MAX_MICRO_BATCHES} (and at most the rows of a replica's batch; "
            "4-32 is typical: the bubble (K-1)/(M+K-1) is small from M = 4K)",
            fix="pass micro_batches=8 (or tfdist-launch --micro-batches 8)"))
    if batch is not None and batch % micro_batches:
        raise StrategyConfigError(format_error(
            f"A batch of {batch} rows cannot be cut into {micro_batches} equal micro-batches.",
            received=f"batch={batch}, micro_batches={micro_batches}",
            expected=f"a batch that is a multiple of {micro_batches}",
            fix=f"use a batch of {batch - batch % micro_batches or micro_batches} (and "
            "drop_remainder=True in Dataset.batch), or another micro_batches"))
    return micro_batches


def bounds_from_split_points(
    layer_names: Sequence[str], split_points: Sequence[str], stages: int | None = None
) -> tuple[int, ...]:
    """The partition whose stages ``1..K-1`` start at the layers named in ``split_points``.

    Raises:
        StrategyConfigError: a name is not a layer, is the first layer, repeats, is out of
            order, or there are not ``stages - 1`` of them.

    Example:
        >>> bounds_from_split_points(["d0", "d1", "d2", "d3"], ["d1", "d3"])
        (0, 1, 3, 4)
    """
    names = list(layer_names)
    if stages is not None and len(split_points) != stages - 1:
        raise StrategyConfigError(format_error(
            f"{stages} stages need {stages - 1} split point(s).",
            received=f"split_points={list(split_points)}", expected=f"{stages - 1} layer names",
            fix="name the first layer of every stage but the first, or leave split_points out "
            "to balance the stages automatically"))
    starts = []
    for point in split_points:
        if point not in names:
            raise StrategyConfigError(format_error(
                f"Split point {point!r} is not a layer of the model.",
                received=f"split_points={list(split_points)}",
                expected=f"names among {names}", fix="use model.summary() to see layer names"))
        starts.append(names.index(point))
    if starts and starts[0] == 0:
        raise StrategyConfigError(format_error(
            f"Split point {names[0]!r} is the first layer: stage 0 would be empty.",
            received=f"split_points={list(split_points)}",
            expected="the first layer of stages 1..K-1", fix=f"drop {names[0]!r}"))
    if any(b <= a for a, b in itertools.pairwise(starts)):
        raise StrategyConfigError(format_error(
            "Split points must be distinct and in the model's layer order.",
            received=f"split_points={list(split_points)} (layer positions {starts})",
            expected="strictly increasing positions",
            fix=f"order them as {sorted(set(split_points), key=names.index)}"))
    return (0, *starts, len(names))


def balanced_bounds(costs: Sequence[float], stages: int,
                    cut_costs: Sequence[float] | None = None) -> tuple[int, ...]:
    """The contiguous partition of ``costs`` into ``stages`` parts whose largest part is least.

    ``costs`` are per-layer (parameter counts, or measured seconds). Among partitions whose
    largest part is least, the one whose cuts carry the least (``cut_costs[i]``: what a cut
    before layer ``i`` carries, e.g. bytes per row; see `cut_bytes`). Exact (dynamic
    programming, O(K n^2)); remaining ties favour earlier split points.

    Example:
        >>> balanced_bounds([4, 1, 1, 1, 1], stages=2)
        (0, 1, 5)
        >>> balanced_bounds([1, 2, 3, 4, 5, 6], stages=3)
        (0, 3, 5, 6)
        >>> balanced_bounds([2, 0, 0, 2], stages=2, cut_costs=[0, 9, 1, 9])
        (0, 2, 4)
    """
    n = len(costs)
    check_stages(stages, n)
    carried = [float(c) for c in cut_costs] if cut_costs is not None else [0.0] * n
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + float(cost))
    inf = (float("inf"), float("inf"))
    # best[k][j]: least (max-stage cost, cut cost) of layers[:j] in k stages; cut[k][j]: start
    # of stage k-1.
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = (0.0, 0.0)
    for k in range(1, stages + 1):
        for j in range(k, n - (stages - k) + 1):
            for i in range(k - 1, j):
                before = best[k - 1][i]
                value = (max(before[0], prefix[j] - prefix[i]),
                         before[1] + (carried[i] if i else 0.0))
                if value < best[k][j]:
                    best[k][j], cut[k][j] = value, i
    bounds = [n]
    for k in range(stages, 0, -1):
        bounds.append(cut[k][bounds[-1]])
    return tuple(reversed(bounds))


def check_layer_costs(costs: object, names: Sequence[str]) -> list[float]:
    """``costs`` as floats if there is one finite, non-negative number per layer, else raises.

    Example:
        >>> check_layer_costs([0.5, 1], ["a", "b"])
        [0.5, 1.0]
    """
    ok = isinstance(costs, Sequence) and not isinstance(costs, str) and all(
        isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) and c >= 0
        for c in costs)
    if not ok or len(costs) != len(names):  # type: ignore[arg-type]
        raise StrategyConfigError(format_error(
            "layer_costs must give one finite, non-negative cost per layer.",
            received=f"layer_costs={costs!r} for {len(names)} layers",
            expected=f"{len(names)} numbers (seconds of forward + backward), in layer order "
            f"{list(names)}",
            fix="pass tfdist-advise's layer costs for this model (its --json 'layer_costs'), "
            "or leave layer_costs out to balance by parameter count"))
    return [float(c) for c in costs]  # type: ignore[union-attr]


def read_layer_costs(source: Sequence[float] | str | os.PathLike[str]) -> Sequence[float]:
    """Costs as given, or read from a JSON file: a list, or an object with ``layer_costs``.

    Example:
        >>> read_layer_costs([1.0, 2.0])
        [1.0, 2.0]
    """
    if not isinstance(source, (str, os.PathLike)):
        return source
    try:
        data = json.loads(Path(source).read_text())
        return data["layer_costs"] if isinstance(data, dict) else data
    except (OSError, ValueError, KeyError) as err:
        raise StrategyConfigError(format_error(
            f"Cannot read layer costs from {str(source)!r}: {err}.", received=str(source),
            expected="a JSON list of per-layer seconds, or tfdist-advise --json output",
            fix="write it with tfdist-advise --json FILE, or unset TFDIST_PIPELINE_LAYER_COSTS"
        )) from err


def stage_costs(costs: Sequence[float], bounds: Sequence[int]) -> list[float]:
    """The summed cost of each stage.

    Example:
        >>> stage_costs([1, 2, 3], (0, 2, 3))
        [3.0, 3.0]
    """
    return [float(sum(costs[a:b])) for a, b in itertools.pairwise(bounds)]


def crossing(node_inputs: Sequence[Sequence[int]], node_outputs: Sequence[Sequence[int]],
             model_inputs: Sequence[int], model_outputs: Sequence[int],
             bounds: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """The tensors alive across each cut: ``result[c]`` lists (by id) what stage ``c`` hands to
    stage ``c + 1``.

    Node ``i`` reads tensors ``node_inputs[i]`` and makes ``node_outputs[i]``; stage ``k`` holds
    nodes ``bounds[k]:bounds[k+1]``. A tensor crosses cut ``c`` when it exists before it (a model
    input, or made by a node of stages ``0..c``) and is needed after it (read by a node of stages
    ``c+1..``, or a model output). A tensor needed two stages later crosses both cuts: the stage
    between passes it on.

    Example:
        >>> # x -> a -> b -> add(x, b): x (tensor 0) is alive across the cut after node 0.
        >>> crossing([(0,), (1,), (0, 2)], [(1,), (2,), (3,)], [0], [3], (0, 1, 3))
        ((0, 1),)
    """
    made = {t: -1 for t in model_inputs}
    for i, outputs in enumerate(node_outputs):
        made.update({t: i for t in outputs})
    last_use = dict.fromkeys(made, -1)
    for i, inputs in enumerate(node_inputs):
        for t in inputs:
            last_use[t] = max(last_use[t], i)
    end = len(node_inputs)
    for t in model_outputs:
        last_use[t] = end
    cuts = []
    for cut in bounds[1:-1]:
        cuts.append(tuple(sorted(t for t, at in made.items() if at < cut <= last_use[t])))
    return tuple(cuts)


def cut_bytes(node_inputs: Sequence[Sequence[int]], node_outputs: Sequence[Sequence[int]],
              model_inputs: Sequence[int], model_outputs: Sequence[int],
              tensor_bytes: Sequence[int]) -> list[int]:
    """``result[i]``: the bytes per row a cut before node ``i`` carries (``i`` in ``1..n-1``;
    ``result[0]`` is 0).

    Example:
        >>> cut_bytes([(0,), (1,), (0, 2)], [(1,), (2,), (3,)], [0], [3], [4, 8, 8, 4])
        [0, 12, 12]
    """
    n = len(node_inputs)
    alive = crossing(node_inputs, node_outputs, model_inputs, model_outputs, range(n + 1))
    return [0, *[sum(tensor_bytes[t] for t in tensors) for tensors in alive[:n - 1]]]


def check_layer_classes(classes: Sequence[str], names: Sequence[str], micro_batches: int) -> None:
    """Raises for a layer the pipeline cannot train exactly (see `UNSUPPORTED_LAYERS`).

    Example:
        >>> check_layer_classes(["Dense", "BatchNormalization"], ["d", "bn"], micro_batches=1)
    """
    if micro_batches == 1:
        return
    for cls, name in zip(classes, names, strict=True):
        if cls in UNSUPPORTED_LAYERS:
            raise StrategyConfigError(format_error(
                f"Layer {name!r} is a {cls}: with micro_batches={micro_batches}, "
                f"{UNSUPPORTED_LAYERS[cls]}.",
                received=f"{name!r} ({cls}), micro_batches={micro_batches}",
                expected=f"no {cls} when micro_batches > 1",
                fix=BATCH_NORM_FIX if cls == "BatchNormalization" else
                "use micro_batches=1, or LayerNormalization/GroupNormalization instead"))


def check_added_losses(added: Sequence[str | None], names: Sequence[str],
                       micro_batches: int) -> None:
    """Raises for a layer whose per-call loss micro-batches cannot reproduce (``added[i]`` says
    what it adds, None for nothing or an exact term; see `tfdist.pipeline.stage.added_loss`).

    Example:
        >>> check_added_losses([None, None], ["a", "b"], micro_batches=4)
    """
    if micro_batches == 1:
        return
    for what, name in zip(added, names, strict=True):
        if what is not None:
            raise StrategyConfigError(format_error(
                f"Layer {name!r} adds a loss in each call ({what}): with "
                f"micro_batches={micro_batches} it would be computed per micro-batch, and how "
                "it combines over rows is unknown, so training could differ from one device "
                "on the whole batch.",
                received=f"{name!r}: {what}, micro_batches={micro_batches}",
                expected="weight regularizers and L1/L2/L1L2 activity regularizers only, "
                "when micro_batches > 1",
                fix="use micro_batches=1, or an L1/L2/L1L2 activity_regularizer or a weight "
                "regularizer instead"))
