"""Runs pipeline schedules against each other on paper: the order (`simulate`) and the step
time (`step_time`) of the ranks' actions, for any schedule of `tfdist.pipeline.schedule`.

A rank's action is ``(op, micro_batch)`` or ``(op, micro_batch, chunk)``; chunk ``c`` of rank
``k`` is piece ``c K + k`` of the model. What an op waits for:

* ``"F"`` of piece ``p``: the F of the same micro-batch on piece ``p - 1`` (unless ``p = 0``);
* ``"B"`` or ``"I"`` of piece ``p``: its own F, and the input gradient of piece ``p + 1`` (its
  B or I; unless ``p`` is the last piece);
* ``"W"``: its own I.

Example:
    >>> simulate([(("F", 0), ("B", 0)), (("F", 0), ("B", 0))])
    [(0, 'F', 0), (1, 'F', 0), (1, 'B', 0), (0, 'B', 0)]
    >>> step_time([(("F", 0), ("I", 0), ("W", 0))], forward=1.0, backward=2.0, weight=0.5)
    3.0
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tfdist.errors import StrategyConfigError, format_error

__all__ = ["FORWARD", "BACKWARD", "BACKWARD_INPUT", "BACKWARD_WEIGHT", "simulate", "step_time"]

FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT = "F", "B", "I", "W"
_GRADIENT = "G"  # the input gradient a piece sent: done by its B or its I

_Key = tuple[str, int, int]


def _pieces(schedules: Sequence[Sequence[Any]]) -> int:
    chunks = 1 + max((op[2] if len(op) > 2 else 0) for ops in schedules for op in ops)
    return len(schedules) * chunks


def _needs(op: str, m: int, piece: int, last: int) -> list[_Key]:
    """What ``op`` of micro-batch ``m`` on ``piece`` waits for (see the module)."""
    if op == FORWARD:
        return [(FORWARD, m, piece - 1)] if piece else []
    if op == BACKWARD_WEIGHT:
        return [(BACKWARD_INPUT, m, piece)]
    return [(FORWARD, m, piece)] + ([(_GRADIENT, m, piece + 1)] if piece < last else [])


def _done(op: str, m: int, piece: int) -> list[_Key]:
    keys = [(op, m, piece)]
    return keys + [(_GRADIENT, m, piece)] if op in (BACKWARD, BACKWARD_INPUT) else keys


def simulate(schedules: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """Runs the ranks' schedules against each other with blocking receives; returns the order.

    Each rank runs its ops in order; an op waits until its inputs exist (see the module).
    Sends never wait.

    Returns:
        ``(rank, *action)`` in one possible completion order.

    Raises:
        StrategyConfigError: the schedules deadlock, or some op is missing or repeated.
    """
    stages, last = len(schedules), _pieces(schedules) - 1
    done: set[_Key] = set()
    position = [0] * stages
    order: list[tuple[Any, ...]] = []
    progress = True
    while progress:
        progress = False
        for k, ops in enumerate(schedules):
            if position[k] == len(ops):
                continue
            action = ops[position[k]]
            piece = (action[2] if len(action) > 2 else 0) * stages + k
            if all(n in done for n in _needs(action[0], action[1], piece, last)):
                done.update(_done(action[0], action[1], piece))
                order.append((k, *action))
                position[k] += 1
                progress = True
    if any(p < len(ops) for p, ops in zip(position, schedules, strict=True)):
        pairs = enumerate(zip(position, schedules, strict=True))
        stuck = {k: tuple(ops[p]) for k, (p, ops) in pairs if p < len(ops)}
        raise StrategyConfigError(format_error(
            "The pipeline schedules deadlock.", received=f"stages waiting at {stuck}",
            expected="every op able to run", fix="check the schedule's actions"))
    return order


def step_time(schedules: Sequence[Sequence[Any]], forward: float = 1.0, backward: float = 2.0,
              weight: float | None = None) -> float:
    """The simulated step time of the ranks' schedules, transfers free.

    Args:
        schedules: Each rank's actions.
        forward: One micro-batch's forward through one rank (all its chunks: each chunk's
            takes ``forward / v``).
        backward: Its whole backward (B); split, I takes ``backward - weight`` and W ``weight``.
        weight: W's share of ``backward`` (default: half).

    Example:
        >>> plans = [(("F", 0), ("F", 1), ("B", 0), ("B", 1)), (("F", 0), ("B", 0), ("F", 1),
        ...          ("B", 1))]
        >>> step_time(plans)  # (M + K - 1) x 3
        9.0
    """
    stages, last = len(schedules), _pieces(schedules) - 1
    chunks = (last + 1) // stages
    weight = backward / 2 if weight is None else weight
    cost = {FORWARD: forward, BACKWARD: backward, BACKWARD_INPUT: backward - weight,
            BACKWARD_WEIGHT: weight}
    finished: dict[_Key, float] = {}
    clock = [0.0] * stages
    for k, op, m, *rest in simulate(schedules):
        piece = (rest[0] if rest else 0) * stages + k
        start = max([clock[k], *[finished[n] for n in _needs(op, m, piece, last)]])
        clock[k] = start + cost[op] / chunks
        for key in _done(op, m, piece):
            finished[key] = clock[k]
    return max(clock)
