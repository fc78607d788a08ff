"""Which stage runs which micro-batch when: pipeline schedules as classes with one interface.

A schedule (`PipelineSchedule`) of K ranks, M micro-batches and v model chunks per rank gives
each rank's ordered actions (`Action`: op, micro-batch, chunk). The ops:

* ``"F"`` forward: receive the activation from the previous piece unless first, run the piece,
  send the output on unless last (the last piece takes the loss);
* ``"B"`` full backward: receive the output's gradient (or take the loss's), accumulate the
  piece's weight gradients, send the input's gradient back unless first;
* ``"I"`` and ``"W"``, a backward split in two (zero bubble, arXiv 2401.10241): ``"I"`` computes
  and sends the input's gradient (the critical path upstream), ``"W"`` later the weight
  gradients of the same micro-batch (`tfdist.pipeline.split_backward`).

Every schedule runs each micro-batch's F before its backward, and ends with one synchronous update
of the accumulated gradients, so a step equals one step on the whole batch (a mean loss scaled by
1/M per micro-batch). The schedules, by name (`SCHEDULES`; `register_schedule` adds one):

* ``gpipe`` (`GPipe`): all forwards, then all backwards (arXiv 1811.06965): a rank keeps the
  activations of all M micro-batches.
* ``1f1b`` (`OneFOneB`): after ``K - k - 1`` warm-up forwards, one forward and one backward in
  turn (PipeDream-Flush): rank k keeps at most ``K - k`` micro-batches' activations.
* ``interleaved`` (`Interleaved`, Megatron-LM's interleaved 1F1B, arXiv 2104.04473): each rank
  holds v chunks (piece ``c K + k`` is chunk ``c`` of rank ``k``); the bubble shrinks v-fold.
* ``zb-h1`` (`ZeroBubbleH1`): 1F1B whose backwards are split into I and W, rank ``k`` deferring
  ``k`` of its W into the bubble: at most K micro-batches held anywhere (1F1B's most).

Each schedule's bubble comes from the one simulator (`step_time`): the same function answers for
the engine's order (`simulate`), the benchmark's bound and the advisor's prediction.

Example:
    >>> OneFOneB(stages=2, micro_batches=3).actions(0)
    (Action(op='F', micro_batch=0, chunk=0), Action(op='F', micro_batch=1, chunk=0), \
Action(op='B', micro_batch=0, chunk=0), Action(op='F', micro_batch=2, chunk=0), \
Action(op='B', micro_batch=1, chunk=0), Action(op='B', micro_batch=2, chunk=0))
    >>> round(schedule_class("zb-h1")(stages=2, micro_batches=4).bubble(), 3)
    0.077
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

from tfdist.errors import StrategyConfigError, format_error
from tfdist.pipeline.partition import check_micro_batches, check_stages
from tfdist.pipeline.simulator import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    simulate,
    step_time,
)

__all__ = [
    "FORWARD", "BACKWARD", "BACKWARD_INPUT", "BACKWARD_WEIGHT", "Action", "Schedule",
    "PipelineSchedule", "GPipe", "OneFOneB", "Interleaved", "ZeroBubbleH1", "SCHEDULES",
    "run_actions", "register_schedule", "schedule_class", "gpipe", "one_f_one_b", "get_schedule",
    "bubble_fraction", "max_in_flight", "simulate", "interleaved",
    "interleaved_bubble_fraction", "check_interleaved", "step_time", "MAX_TRANSFERS",
]

Schedule = tuple[tuple[Any, ...], ...]
"""One rank's ops: `Action`s, or the ``(op, micro_batch)`` pairs of `get_schedule`."""
MAX_TRANSFERS = 4096
"""Micro-batch numbers an instance key holds (12 bits): the engine's ``K v M`` stays below."""


class Action(NamedTuple):
    """One op of a rank: ``op`` (``"F"``, ``"B"``, ``"I"``, ``"W"``) on ``micro_batch`` in the
    rank's chunk ``chunk`` (0 when a rank holds one stage)."""

    op: str
    micro_batch: int
    chunk: int = 0


class PipelineSchedule:
    """The one interface of pipeline schedules; a subclass defines `actions` (and `check` if it
    needs more than K >= 1, M >= 1, v = 1).

    Attributes:
        stages: K, the ranks of one pipeline.
        micro_batches: M per step.
        chunks: v, the model chunks each rank holds (pieces: K v).

    Class attributes:
        name: The name the registry, the launcher's ``--schedule`` and the config know it by.
        summary: A few words for ``--help`` and the docs.
        multi_chunk: Whether a rank may hold several chunks (torch's ``PipelineScheduleMulti``).
        split_backward: Whether its backwards are split into ``"I"`` and ``"W"``
            (`tfdist.pipeline.split_backward`).

    Example:
        >>> GPipe(2, 2).actions(1)[2:]
        (Action(op='B', micro_batch=0, chunk=0), Action(op='B', micro_batch=1, chunk=0))
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    multi_chunk: ClassVar[bool] = False
    split_backward: ClassVar[bool] = False

    def __init__(self, stages: int, micro_batches: int, chunks: int = 1) -> None:
        self.check(stages, micro_batches, chunks)
        self.stages, self.micro_batches, self.chunks = stages, micro_batches, chunks

    @classmethod
    def check(cls, stages: int, micro_batches: int, chunks: int = 1,
              layers: int | None = None) -> None:
        """Raises `StrategyConfigError` unless the schedule can run these sizes (and a model of
        ``layers`` cuttable layers)."""
        del layers
        check_stages(stages)
        check_micro_batches(micro_batches)
        if chunks != 1:
            multi = [n for n, c in SCHEDULES.items() if c.multi_chunk]
            raise StrategyConfigError(format_error(
                f"Model chunks per process are for the {' or '.join(multi)} schedule.",
                received=f"chunks={chunks!r}, schedule={cls.name!r}",
                expected=f"chunks=1, or schedule={multi[0]!r}",
                fix=f"pass schedule={multi[0]!r} (tfdist-launch --schedule {multi[0]}), or "
                "drop chunks"))

    def actions(self, stage: int) -> tuple[Action, ...]:
        """Rank ``stage``'s ordered actions of one training step."""
        raise NotImplementedError

    def all_actions(self) -> list[tuple[Action, ...]]:
        """Every rank's actions, rank 0 first."""
        return [self.actions(k) for k in range(self.stages)]

    def _rank(self, stage: int) -> int:
        if not 0 <= stage < self.stages:
            raise StrategyConfigError(format_error(
                "stage is out of range.", received=f"stage={stage}, stages={self.stages}",
                expected=f"0 <= stage < {self.stages}", fix="pass this process's stage index"))
        return stage

    def step_time(self, forward: float = 1.0, backward: float = 2.0,
                  weight: float | None = None) -> float:
        """The simulated step of one micro-batch's whole forward ``forward`` and backward
        ``backward`` (of which ``weight``, default half, is W's), transfers free."""
        return step_time(self.all_actions(), forward, backward, weight)

    def bubble(self, forward: float = 1.0, backward: float = 2.0,
               weight: float | None = None) -> float:
        """The idle share of a step with equal pieces: ``(step - M (f + b)) / step``."""
        step = self.step_time(forward, backward, weight)
        return (step - self.micro_batches * (forward + backward)) / step

    def idle_slots(self, forward: float = 1.0, backward: float = 2.0,
                   weight: float | None = None) -> float:
        """The bubble in micro-batch slots (one slot: a micro-batch's whole forward and
        backward through one rank): ``K - 1`` for GPipe and 1F1B."""
        return self.step_time(forward, backward, weight) / (forward + backward) - \
            self.micro_batches

    def in_flight(self, stage: int | None = None) -> int:
        """Most micro-batches whose activations rank ``stage`` (default: any rank) holds at
        once: forward done, backward (its W, when split) not."""
        ranks = range(self.stages) if stage is None else [self._rank(stage)]
        return max(max_in_flight(self.actions(k)) for k in ranks)


def _one_f_one_b(stages: int, micro_batches: int, stage: int,
                 backward: str = BACKWARD) -> list[Action]:
    """Warm-up forwards, then one forward and one ``backward`` in turn, then the last ones."""
    warmup = min(stages - stage - 1, micro_batches)
    ops = [Action(FORWARD, m) for m in range(warmup)]
    for m in range(micro_batches):
        if warmup + m < micro_batches:
            ops.append(Action(FORWARD, warmup + m))
        ops.append(Action(backward, m))
    return ops


class GPipe(PipelineSchedule):
    """All forwards in order, then all backwards in order.

    Example:
        >>> [a.op for a in GPipe(stages=3, micro_batches=2).actions(2)]
        ['F', 'F', 'B', 'B']
    """

    name = "gpipe"
    summary = "all forwards, then all backwards (default)"

    def actions(self, stage: int) -> tuple[Action, ...]:
        self._rank(stage)
        micro = range(self.micro_batches)
        return tuple([Action(FORWARD, m) for m in micro] + [Action(BACKWARD, m) for m in micro])


class OneFOneB(PipelineSchedule):
    """Warm-up forwards, then one forward and one backward in turn, then the last backwards.

    Example:
        >>> [a.op + str(a.micro_batch) for a in OneFOneB(2, 3).actions(1)]
        ['F0', 'B0', 'F1', 'B1', 'F2', 'B2']
    """

    name = "1f1b"
    summary = "one forward, one backward: keeps fewer activations"

    def actions(self, stage: int) -> tuple[Action, ...]:
        return tuple(_one_f_one_b(self.stages, self.micro_batches, self._rank(stage)))


class ZeroBubbleH1(PipelineSchedule):
    """ZB-H1 (arXiv 2401.10241): 1F1B with each backward split into I (the input's gradient,
    sent upstream at once) and W (the weight gradients); rank ``k`` defers its first ``k`` W
    into the cool-down, where 1F1B waits. Rank ``k`` then holds at most
    ``(K - k) + k = K`` micro-batches (1F1B's rank 0), and the bubble of K-1 slots shrinks to
    about a third when F, I and W take as long each.

    Example:
        >>> [a.op + str(a.micro_batch) for a in ZeroBubbleH1(2, 3).actions(1)]
        ['F0', 'I0', 'F1', 'I1', 'W0', 'F2', 'I2', 'W1', 'W2']
    """

    name = "zb-h1"
    summary = "zero bubble: 1F1B with the weight gradients moved into the bubble"
    split_backward = True

    def actions(self, stage: int) -> tuple[Action, ...]:
        deferred = self._rank(stage)
        ops: list[Action] = []
        weights = 0
        for action in _one_f_one_b(self.stages, self.micro_batches, stage, BACKWARD_INPUT):
            ops.append(action)
            if action.op == BACKWARD_INPUT and action.micro_batch >= deferred:
                ops.append(Action(BACKWARD_WEIGHT, weights))
                weights += 1
        return tuple(ops + [Action(BACKWARD_WEIGHT, m)
                            for m in range(weights, self.micro_batches)])


class Interleaved(PipelineSchedule):
    """Interleaved 1F1B over the ``chunks`` model chunks of each rank: warm-up forwards, then
    one forward and one backward in turn; micro-batches go in groups of K through chunk 0, then
    chunk 1, ... (backwards through the chunks in reverse). M must be a multiple of K.

    Example:
        >>> Interleaved(stages=2, micro_batches=2, chunks=2).actions(1)[:3]
        (Action(op='F', micro_batch=0, chunk=0), Action(op='F', micro_batch=1, chunk=0), \
Action(op='F', micro_batch=0, chunk=1))
    """

    name = "interleaved"
    summary = "1F1B over --chunks model chunks per process (a v-fold smaller bubble)"
    multi_chunk = True

    @classmethod
    def check(cls, stages: int, micro_batches: int, chunks: int = 1,
              layers: int | None = None) -> None:
        check_stages(stages)
        check_micro_batches(micro_batches)
        check_interleaved(stages, micro_batches, chunks, layers)

    def actions(self, stage: int) -> tuple[Action, ...]:
        stages, chunks = self.stages, self.chunks
        total, group = self.micro_batches * chunks, stages * chunks

        def op(kind: str, i: int) -> Action:
            chunk = (i % group) // stages
            return Action(kind, (i // group) * stages + i % stages,
                          chunk if kind == FORWARD else chunks - 1 - chunk)

        warmup = min((stages - self._rank(stage) - 1) * 2 + (chunks - 1) * stages, total)
        if chunks == 1:
            warmup = min(stages - stage - 1, total)
        ops = [op(FORWARD, i) for i in range(warmup)]
        for j in range(total - warmup):
            ops += [op(FORWARD, warmup + j), op(BACKWARD, j)]
        ops += [op(BACKWARD, j) for j in range(total - warmup, total)]
        return tuple(ops)


SCHEDULES: dict[str, type[PipelineSchedule]] = {
    cls.name: cls for cls in (GPipe, OneFOneB, Interleaved, ZeroBubbleH1)}
"""Every schedule by name: what the engine, ``tfdist-launch --schedule``, the config, the
simulator, the benchmark and the advisor read (`register_schedule` adds one)."""


def register_schedule(cls: type[PipelineSchedule]) -> type[PipelineSchedule]:
    """Adds ``cls`` to `SCHEDULES` under ``cls.name`` (usable as a class decorator).

    Example:
        >>> class Reversed(GPipe):
        ...     name = "reversed-gpipe"
        >>> register_schedule(Reversed) is Reversed and "reversed-gpipe" in SCHEDULES
        True
        >>> del SCHEDULES["reversed-gpipe"]
    """
    if not cls.name or not issubclass(cls, PipelineSchedule):
        raise StrategyConfigError(format_error(
            "A schedule needs a name and the PipelineSchedule interface.",
            received=f"{cls!r} name={getattr(cls, 'name', None)!r}",
            expected="a PipelineSchedule subclass with a non-empty name",
            fix="subclass tfdist.pipeline.schedule.PipelineSchedule and set name"))
    SCHEDULES[cls.name] = cls
    return cls


def schedule_class(name: str) -> type[PipelineSchedule]:
    """The schedule called ``name``.

    Example:
        >>> schedule_class("1f1b").__name__
        'OneFOneB'
    """
    if name not in SCHEDULES:
        raise StrategyConfigError(format_error(
            "Unknown pipeline schedule.", received=f"schedule={name!r}",
            expected=f"one of {', '.join(SCHEDULES)}",
            fix="use 'gpipe' (simplest) or '1f1b' (keeps fewer activations)"))
    return SCHEDULES[name]


def get_schedule(name: str, stages: int, micro_batches: int, stage: int) -> Schedule:
    """The ``(op, micro_batch)`` pairs of rank ``stage`` of the one-chunk schedule ``name``.

    Example:
        >>> get_schedule("gpipe", 2, 1, 0)
        (('F', 0), ('B', 0))
    """
    plan = schedule_class(name)(stages, micro_batches)
    return tuple((a.op, a.micro_batch) for a in plan.actions(stage))


def gpipe(stages: int, micro_batches: int, stage: int) -> Schedule:
    """`GPipe`'s ``(op, micro_batch)`` pairs of rank ``stage``.

    Example:
        >>> gpipe(stages=3, micro_batches=2, stage=2)
        (('F', 0), ('F', 1), ('B', 0), ('B', 1))
    """
    return get_schedule("gpipe", stages, micro_batches, stage)


def one_f_one_b(stages: int, micro_batches: int, stage: int) -> Schedule:
    """`OneFOneB`'s ``(op, micro_batch)`` pairs of rank ``stage``.

    Example:
        >>> one_f_one_b(stages=2, micro_batches=3, stage=1)
        (('F', 0), ('B', 0), ('F', 1), ('B', 1), ('F', 2), ('B', 2))
    """
    return get_schedule("1f1b", stages, micro_batches, stage)


def interleaved(stages: int, micro_batches: int, stage: int, chunks: int) -> Schedule:
    """`Interleaved`'s ``(op, micro_batch, chunk)`` of rank ``stage``.

    Example:
        >>> interleaved(stages=2, micro_batches=2, stage=1, chunks=2)[:4]
        (('F', 0, 0), ('F', 1, 0), ('F', 0, 1), ('B', 0, 1))
    """
    return tuple(tuple(a) for a in Interleaved(stages, micro_batches, chunks).actions(stage))


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """The idle share of a GPipe or 1F1B step with equal stages: ``(K-1)/(M+K-1)``.

    Example:
        >>> bubble_fraction(2, 4)
        0.2
    """
    return (stages - 1) / (micro_batches + stages - 1)


def interleaved_bubble_fraction(stages: int, micro_batches: int, chunks: int) -> float:
    """The idle share of an interleaved step with equal chunks: ``(K-1)/(v M + K - 1)``.

    Example:
        >>> interleaved_bubble_fraction(2, 4, 2)
        0.1111111111111111
    """
    return (stages - 1) / (chunks * micro_batches + stages - 1)


def max_in_flight(schedule: Sequence[Sequence[Any]]) -> int:
    """Most micro-batches whose activations a rank holds at once (forward done; backward, or
    its W when split, not).

    Example:
        >>> max_in_flight(gpipe(2, 4, 0)), max_in_flight(one_f_one_b(2, 4, 0))
        (4, 2)
    """
    held = most = 0
    for op, *_ in schedule:
        held += {FORWARD: 1, BACKWARD: -1, BACKWARD_WEIGHT: -1}.get(op, 0)
        most = max(most, held)
    return most


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


def run_actions(engines: Sequence[Any], steps: Sequence[Any],
                actions: Sequence[Action]) -> None:
    """Builds a process's ``actions`` in order, each ``(op, micro_batch, chunk)`` by its chunk's
    engine (`tfdist.pipeline.engine.StageEngine`) on its chunk's step, each after the one
    before (whatever its chunk): the one loop of every schedule, for a process holding one
    stage (one chunk) or several chunks.

    Example:
        >>> class Recorder:
        ...     def run_op(self, step, op, m):
        ...         step.chain = step.chain + [f"{op}{m}"]
        >>> class Step:
        ...     chain = []
        >>> steps = [Step(), Step()]
        >>> run_actions([Recorder(), Recorder()], steps, [("F", 0, 0), ("F", 0, 1), ("B", 0, 1)])
        >>> steps[1].chain
        ['F0', 'F0', 'B0']
    """
    chain: list[Any] = []
    for op, m, c in actions:
        steps[c].chain = chain
        engines[c].run_op(steps[c], op, m)
        chain = steps[c].chain
