"""Which process of the data axis owns which rows of which weight (ZeRO's partition), as data.

ZeRO (arXiv 1910.02054) gives each of the D data-parallel processes the optimizer state (stage
1), the summed gradients (stage 2) and the weights (stage 3) of one part of the model. The parts
are balanced by bytes: the trainable weights, in the model's order, are laid end to end and cut
into D runs of about ``total / D`` bytes each, a cut falling inside a weight splitting it by
rows (its first axis), so a large weight is shared by neighbouring owners and each owner's
bytes are within one row of ``total / D``. A `Piece` is rows ``[start, stop)`` of one weight.

Imports no TensorFlow.

Example:
    >>> plan = partition([(4, 2), (2,)], itemsize=4, parts=2)
    >>> [(p.variable, p.start, p.stop, p.owner) for p in plan.pieces]
    [(0, 0, 3, 0), (0, 3, 4, 1), (1, 0, 2, 1)]
    >>> plan.owned_bytes()
    [24, 16]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from tfdist.errors import StrategyConfigError, format_error

__all__ = ["Piece", "ZeroPartition", "partition", "partition_groups", "STAGES", "check_stage"]

STAGES = (1, 2, 3)
"""ZeRO's stages: 1 optimizer state, 2 also the gradients, 3 also the weights."""


def check_stage(stage: object, field: str = "zero") -> int:
    """``stage`` as an int of `STAGES` (0 or None: no ZeRO), else `StrategyConfigError`.

    Example:
        >>> check_stage("2"), check_stage(None)
        (2, 0)
    """
    if stage is None or stage == "" or stage == 0 or stage == "0":
        return 0
    if isinstance(stage, str) and stage.strip().isdigit():
        value = int(stage)
    elif isinstance(stage, int) and not isinstance(stage, bool):
        value = stage
    else:
        value = -1
    if value not in STAGES:
        raise StrategyConfigError(format_error(
            "Unknown ZeRO stage.", received=f"{field}={stage!r}",
            expected="1 (optimizer state sharded), 2 (also the gradients) or 3 (also the "
            "weights), or 0 / unset for plain data parallelism",
            fix=f"pass {field}=1, 2 or 3 (tfdist-launch --zero 1|2|3)"))
    return value


@dataclasses.dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` (along axis 0) of trainable weight number ``variable``, owned by
    data rank ``owner``; ``row`` elements per row (1 for a vector, 1 row for a scalar)."""

    variable: int
    start: int
    stop: int
    owner: int
    row: int

    @property
    def size(self) -> int:
        """Elements in the piece."""
        return (self.stop - self.start) * self.row


@dataclasses.dataclass(frozen=True)
class ZeroPartition:
    """Every weight's pieces and their owners, for D = ``parts`` processes.

    Attributes:
        shapes: Each trainable weight's shape, in the model's order.
        itemsize: Bytes per element (every weight has the same dtype).
        parts: D.
        pieces: In weight order, then row order (owners non-decreasing).
    """

    shapes: tuple[tuple[int, ...], ...]
    itemsize: int
    parts: int
    pieces: tuple[Piece, ...]

    def of_owner(self, owner: int) -> list[Piece]:
        """The pieces ``owner`` holds, in weight order."""
        return [p for p in self.pieces if p.owner == owner]

    def of_variable(self, variable: int) -> list[Piece]:
        """The pieces of one weight, in row order (they cover all its rows)."""
        return [p for p in self.pieces if p.variable == variable]

    def owned_bytes(self) -> list[int]:
        """Bytes each owner holds."""
        return [sum(p.size for p in self.of_owner(d)) * self.itemsize
                for d in range(self.parts)]

    @property
    def total_bytes(self) -> int:
        return sum(math.prod(s) for s in self.shapes) * self.itemsize

    def largest_variable_bytes(self) -> int:
        return max((math.prod(s) for s in self.shapes), default=0) * self.itemsize


def _rows(shape: tuple[int, ...]) -> tuple[int, int]:
    """``(rows, elements per row)`` of a weight: its first axis (a scalar is one row)."""
    if not shape:
        return 1, 1
    return shape[0], math.prod(shape[1:])


def partition(shapes: Sequence[Sequence[int]], itemsize: int, parts: int) -> ZeroPartition:
    """Cuts the weights into ``parts`` runs of about equal bytes, at row boundaries.

    Owner ``d`` takes the rows whose first element lies in ``[d B / D, (d + 1) B / D)`` of the
    weights laid end to end (B bytes in all): a row is never split, a weight may be.

    Raises:
        StrategyConfigError: a shape with an unknown or negative dimension (named).

    Example:
        >>> plan = partition([(10, 3)], itemsize=4, parts=3)
        >>> [(p.start, p.stop, p.owner) for p in plan.pieces]
        [(0, 4, 0), (4, 7, 1), (7, 10, 2)]
    """
    fixed = []
    for index, shape in enumerate(shapes):
        if any(d is None or int(d) < 0 for d in shape):
            raise StrategyConfigError(format_error(
                "ZeRO cannot partition a weight whose shape is not fully known.",
                received=f"trainable weight {index} of shape {tuple(shape)}",
                expected="every trainable weight with a fully defined shape",
                fix="build the model (call it on an input or give keras.Input a full shape) "
                    "before strategy.build_model"))
        fixed.append(tuple(int(d) for d in shape))
    total = sum(math.prod(s) for s in fixed)
    pieces: list[Piece] = []
    offset = 0
    for index, shape in enumerate(fixed):
        rows, row = _rows(shape)
        owners = [min(parts - 1, ((offset + r * row) * parts) // max(total, 1))
                  for r in range(rows)] if rows else []
        start = 0
        for r in range(1, rows + 1):
            if r == rows or owners[r] != owners[start]:
                pieces.append(Piece(index, start, r, owners[start], row))
                start = r
        offset += rows * row
    return ZeroPartition(tuple(fixed), itemsize, parts, tuple(pieces))


def partition_groups(shapes: Sequence[Sequence[int]], groups: Sequence[Sequence[int]],
                     itemsize: int, parts: int) -> ZeroPartition:
    """`partition` of each group of weights (one layer's, numbers into ``shapes``) on its own:
    every owner holds about 1/D of each group, so gathering one group moves no padding.

    ZeRO stage 3 gathers layer by layer; cut across the whole model, a layer could belong to
    one owner alone, and the others would send as many bytes of padding to gather it.

    Raises:
        StrategyConfigError: as `partition`; or groups that do not cover every weight once.

    Example:
        >>> plan = partition_groups([(4, 2), (2,), (6,)], [[0, 1], [2]], itemsize=4, parts=2)
        >>> [(p.variable, p.start, p.stop, p.owner) for p in plan.pieces]
        [(0, 0, 3, 0), (0, 3, 4, 1), (1, 0, 2, 1), (2, 0, 3, 0), (2, 3, 6, 1)]
    """
    numbers = sorted(i for group in groups for i in group)
    if numbers != list(range(len(shapes))):
        raise StrategyConfigError(format_error(
            "ZeRO's groups of weights must name every trainable weight exactly once.",
            received=f"groups {[list(g) for g in groups]} for {len(shapes)} weights",
            expected=f"each of 0..{len(shapes) - 1} in one group",
            fix="pass each layer's weight numbers once"))
    whole = partition(shapes, itemsize, parts)  # checks every shape
    pieces: list[Piece] = []
    for group in groups:
        ordered = sorted(group)
        cut = partition([whole.shapes[i] for i in ordered], itemsize, parts)
        pieces += [dataclasses.replace(p, variable=ordered[p.variable]) for p in cut.pieces]
    pieces.sort(key=lambda p: (p.variable, p.start))
    return ZeroPartition(whole.shapes, itemsize, parts, tuple(pieces))
