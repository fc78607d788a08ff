"""Which stage runs which micro-batch when: pipeline schedules as pure data.

A schedule of one stage is a tuple of ``(op, micro_batch)``: ``"F"`` (forward: receive the
activation from the previous stage unless first, run the stage, send the output to the next
stage unless last) or ``"B"`` (backward: receive the output's gradient from the next stage, or
take the loss's gradient on the last stage; accumulate this stage's weight gradients; send the
input's gradient to the previous stage unless first). Every schedule runs each micro-batch's F
before its B, and ends with one synchronous update of the accumulated gradients, so a step equals
one step on the whole batch (with a mean loss scaled by 1/M per micro-batch).

* `gpipe`: all forwards, then all backwards (GPipe, arXiv 1811.06965): a stage keeps the
  activations of all M micro-batches.
* `one_f_one_b`: after ``K - stage - 1`` warm-up forwards, alternate one forward and one
  backward (PipeDream-Flush): a stage keeps at most ``K - stage`` micro-batches' activations.

Both have the same bubble, ``(K-1)/(M+K-1)`` of the step (`bubble_fraction`).

* `interleaved` (Megatron-LM's interleaved 1F1B, arXiv 2104.04473): each process holds ``v``
  model chunks (virtual stage ``c K + k`` is chunk ``c`` of process ``k``); its ops are
  ``(op, micro_batch, chunk)``. The bubble shrinks to ``(K-1)/(v M + K - 1)`` of the step
  (`interleaved_bubble_fraction`; Megatron's ``(K-1)/(v M)`` is the same idle time relative to
  the ideal step), for v times as many transfers. Simulated here (`simulate`, `step_time`) and run
  by the engine (`tfdist.pipeline.interleave`).

Example:
    >>> one_f_one_b(stages=2, micro_batches=3, stage=0)
    (('F', 0), ('F', 1), ('B', 0), ('F', 2), ('B', 1), ('B', 2))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tfdist.errors import StrategyConfigError, format_error
from tfdist.pipeline.partition import check_micro_batches, check_stages

__all__ = [
    "FORWARD",
    "BACKWARD",
    "Schedule",
    "SCHEDULES",
    "gpipe",
    "one_f_one_b",
    "get_schedule",
    "bubble_fraction",
    "max_in_flight",
    "simulate",
    "interleaved",
    "interleaved_bubble_fraction",
    "check_interleaved",
    "step_time",
]

FORWARD, BACKWARD = "F", "B"
Schedule = tuple[tuple[Any, ...], ...]
"""Ops ``(op, micro_batch)``, or ``(op, micro_batch, chunk)`` for `interleaved`."""


def _check(stages: int, micro_batches: int, stage: int) -> None:
    check_stages(stages)
    check_micro_batches(micro_batches)
    if not 0 <= stage < stages:
        raise StrategyConfigError(format_error(
            "stage is out of range.", received=f"stage={stage}, stages={stages}",
            expected=f"0 <= stage < {stages}", fix="pass this process's stage index"))


def gpipe(stages: int, micro_batches: int, stage: int) -> Schedule:
    """All forwards in order, then all backwards in order.

    Example:
        >>> gpipe(stages=3, micro_batches=2, stage=2)
        (('F', 0), ('F', 1), ('B', 0), ('B', 1))
    """
    _check(stages, micro_batches, stage)
    return tuple([(FORWARD, m) for m in range(micro_batches)]
                 + [(BACKWARD, m) for m in range(micro_batches)])


def one_f_one_b(stages: int, micro_batches: int, stage: int) -> Schedule:
    """Warm-up forwards, then one forward and one backward in turn, then the last backwards.

    Example:
        >>> one_f_one_b(stages=2, micro_batches=3, stage=1)
        (('F', 0), ('B', 0), ('F', 1), ('B', 1), ('F', 2), ('B', 2))
    """
    _check(stages, micro_batches, stage)
    warmup = min(stages - stage - 1, micro_batches)
    ops = [(FORWARD, m) for m in range(warmup)]
    forward, backward = warmup, 0
    while backward < micro_batches:
        if forward < micro_batches:
            ops.append((FORWARD, forward))
            forward += 1
        ops.append((BACKWARD, backward))
        backward += 1
    return tuple(ops)


SCHEDULES: dict[str, Callable[[int, int, int], Schedule]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
}
"""Schedule names accepted by ``get_strategy("pipeline", schedule=...)``."""


def get_schedule(name: str, stages: int, micro_batches: int, stage: int) -> Schedule:
    """The schedule ``name`` (``"gpipe"`` or ``"1f1b"``) of one stage.

    Example:
        >>> get_schedule("gpipe", 2, 1, 0)
        (('F', 0), ('B', 0))
    """
    if name not in SCHEDULES:
        raise StrategyConfigError(format_error(
            "Unknown pipeline schedule.", received=f"schedule={name!r}",
            expected=f"one of {', '.join(SCHEDULES)}",
            fix="use 'gpipe' (simplest) or '1f1b' (keeps fewer activations)"))
    return SCHEDULES[name](stages, micro_batches, stage)


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """The idle share of a step with equal stages: ``(K-1)/(M+K-1)``.

    Example:
        >>> bubble_fraction(2, 4)
        0.2
    """
    return (stages - 1) / (micro_batches + stages - 1)


def max_in_flight(schedule: Schedule) -> int:
    """Most micro-batches whose activations a stage holds at once (forward done, backward not).

    Example:
        >>> max_in_flight(gpipe(2, 4, 0)), max_in_flight(one_f_one_b(2, 4, 0))
        (4, 2)
    """
    held = most = 0
    for op, _ in schedule:
        held += 1 if op == FORWARD else -1
        most = max(most, held)
    return most


def interleaved(stages: int, micro_batches: int, stage: int, chunks: int) -> Schedule:
    """Interleaved 1F1B: warm-up forwards, then one forward and one backward in turn, over the
    ``chunks`` model chunks of this process; micro-batches go in groups of K through chunk 0,
    then chunk 1, ... (backwards through the chunks in reverse). M must be a multiple of K.

    Example:
        >>> interleaved(stages=2, micro_batches=2, stage=1, chunks=2)[:4]
        (('F', 0, 0), ('F', 1, 0), ('F', 0, 1), ('B', 0, 1))
    """
    _check(stages, micro_batches, stage)
    if chunks < 1 or micro_batches % stages:
        raise StrategyConfigError(format_error(
            "Interleaved 1F1B needs v >= 1 chunks and M a multiple of K.",
            received=f"chunks={chunks}, micro_batches={micro_batches}, stages={stages}",
            expected=f"chunks >= 1 and micro_batches a multiple of {stages}",
            fix=f"use micro_batches={stages * max(1, micro_batches // stages)}"))
    total, group = micro_batches * chunks, stages * chunks

    def op(kind: str, i: int) -> tuple[str, int, int]:
        chunk = (i % group) // stages
        return kind, (i // group) * stages + i % stages, (
            chunk if kind == FORWARD else chunks - 1 - chunk)

    warmup = min((stages - stage - 1) * 2 + (chunks - 1) * stages, total)
    if chunks == 1:
        warmup = min(stages - stage - 1, total)
    ops = [op(FORWARD, i) for i in range(warmup)]
    for j in range(total - warmup):
        ops += [op(FORWARD, warmup + j), op(BACKWARD, j)]
    ops += [op(BACKWARD, j) for j in range(total - warmup, total)]
    return tuple(ops)  # type: ignore[return-value]


MAX_TRANSFERS = 4096
"""Micro-batch numbers an instance key holds (12 bits): the engine's ``K v M`` stays below."""


def check_interleaved(stages: int, micro_batches: int, chunks: int,
                      layers: int | None = None) -> None:
    """Raises unless interleaved 1F1B can run K stages x v chunks on M micro-batches (and a
    model of ``layers`` cuttable layers).

    Example:
        >>> check_interleaved(2, 3, 2)
        Traceback (most recent call last):
        ...
        tfdist.errors.StrategyConfigError: Interleaved 1F1B sends micro-batches through the \
chunks in groups of K. Received: micro_batches=3, stages=2. Expected: micro_batches a multiple \
of 2. Fix: use micro_batches=2 or 4
    """
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise StrategyConfigError(format_error(
            "chunks must be a positive int.", received=f"chunks={chunks!r}",
            expected="an int >= 1 (model chunks per process, v)",
            fix="pass chunks=2 with schedule='interleaved'"))
    if stages < 2:
        raise StrategyConfigError(format_error(
            "Interleaved 1F1B needs a pipeline of several processes.",
            received=f"stages={stages}", expected="stages >= 2",
            fix="use stages=2 or more, or schedule='1f1b'"))
    if micro_batches % stages:
        low = max(stages, micro_batches - micro_batches % stages)
        raise StrategyConfigError(format_error(
            "Interleaved 1F1B sends micro-batches through the chunks in groups of K.",
            received=f"micro_batches={micro_batches}, stages={stages}",
            expected=f"micro_batches a multiple of {stages}",
            fix=f"use micro_batches={low} or {low + stages}"))
    if stages * chunks * micro_batches >= MAX_TRANSFERS:
        raise StrategyConfigError(format_error(
            "Too many transfers per step for the instance keys.",
            received=f"stages x chunks x micro_batches = {stages * chunks * micro_batches}",
            expected=f"below {MAX_TRANSFERS}", fix="use fewer chunks or micro-batches"))
    if layers is not None and stages * chunks > layers:
        raise StrategyConfigError(format_error(
            f"The model has {layers} layer(s), fewer than the {stages} x {chunks} pieces "
            "interleaving asks for.", received=f"stages={stages}, chunks={chunks}, "
            f"layers={layers}", expected=f"stages x chunks <= {layers}",
            fix=f"use chunks={max(1, layers // stages)} or fewer, or a deeper model"))


def interleaved_bubble_fraction(stages: int, micro_batches: int, chunks: int) -> float:
    """The idle share of an interleaved step with equal chunks: ``(K-1)/(v M + K - 1)``.

    Example:
        >>> interleaved_bubble_fraction(2, 4, 2)
        0.1111111111111111
    """
    return (stages - 1) / (chunks * micro_batches + stages - 1)


def _virtual(op: tuple[Any, ...], stage: int, stages: int) -> tuple[str, int, int]:
    """``(op, micro_batch, virtual stage)``: chunk ``c`` of process ``k`` is ``c K + k``."""
    chunk = op[2] if len(op) > 2 else 0
    return op[0], op[1], chunk * stages + stage


def step_time(schedules: Sequence[Schedule], forward: float = 1.0,
              backward: float = 2.0) -> float:
    """The simulated step time of the processes' schedules, each op of a chunk taking
    ``forward / v`` or ``backward / v`` (v chunks per process), transfers free.

    Example:
        >>> step_time([one_f_one_b(2, 4, k) for k in range(2)])  # (M + K - 1) x 3
        15.0
        >>> step_time([interleaved(2, 4, k, 2) for k in range(2)])  # (M + (K-1)/v) x 3
        13.5
    """
    stages = len(schedules)
    chunks = 1 + max((op[2] if len(op) > 2 else 0) for ops in schedules for op in ops)
    finished: dict[tuple[str, int, int], float] = {}
    clock = [0.0] * stages
    for k, op, m, *rest in simulate(schedules):
        kind, _, virtual = _virtual((op, m, *rest), k, stages)
        needs = [(FORWARD, m, virtual - 1)] if kind == FORWARD and virtual else []
        if kind == BACKWARD:
            needs.append((FORWARD, m, virtual))
            if virtual < stages * chunks - 1:
                needs.append((BACKWARD, m, virtual + 1))
        start = max([clock[k], *[finished[n] for n in needs]])
        clock[k] = start + (forward if kind == FORWARD else backward) / chunks
        finished[(kind, m, virtual)] = clock[k]
    return max(clock)


def simulate(schedules: Sequence[Schedule]) -> list[tuple[int, str, int]]:
    """Runs the stages' schedules against each other with blocking receives; returns the order.

    Each stage runs its ops in order; an op waits until its input has arrived (the previous
    stage's F of that micro-batch, or the next stage's B). Sends never wait.

    Returns:
        ``(stage, op, micro_batch)`` in one possible completion order.

    Raises:
        StrategyConfigError: the schedules deadlock, or some op is missing or repeated.

    Example:
        >>> simulate([gpipe(2, 1, 0), gpipe(2, 1, 1)])
        [(0, 'F', 0), (1, 'F', 0), (1, 'B', 0), (0, 'B', 0)]
    """
    stages = len(schedules)
    chunks = 1 + max((op[2] if len(op) > 2 else 0) for ops in schedules for op in ops)
    last = stages * chunks - 1
    done: set[tuple[str, int, int]] = set()
    position = [0] * stages
    order = []
    progress = True
    while progress:
        progress = False
        for k, ops in enumerate(schedules):
            if position[k] == len(ops):
                continue
            op, m, v = _virtual(ops[position[k]], k, stages)
            if op == FORWARD:
                ready = v == 0 or (FORWARD, m, v - 1) in done
            else:
                ready = (FORWARD, m, v) in done and (v == last or (BACKWARD, m, v + 1) in done)
            if ready:
                done.add((op, m, v))
                order.append((k, *ops[position[k]]))
                position[k] += 1
                progress = True
    if any(p < len(ops) for p, ops in zip(position, schedules, strict=True)):
        pairs = enumerate(zip(position, schedules, strict=True))
        stuck = {k: ops[p] for k, (p, ops) in pairs if p < len(ops)}
        raise StrategyConfigError(format_error(
            "The pipeline schedules deadlock.", received=f"stages waiting at {stuck}",
            expected="every op able to run", fix="check the schedule functions"))
    return order
