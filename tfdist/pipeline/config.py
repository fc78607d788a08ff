"""What a pipeline is configured by, validated once: `PipelineConfig`. TensorFlow-free.

The strategy builds it from its arguments (`PipelineConfig.from_env`: an argument given wins,
then the launcher's environment, then the default); the launcher builds it from its options and
writes it into every task's environment (`PipelineConfig.env`), under the same variable names
the strategy reads. Both sides therefore share one definition and one set of checks.

Variables: ``TFDIST_PIPELINE_STAGES`` (K), ``TFDIST_PIPELINE_MICRO_BATCHES`` (M),
``TFDIST_PIPELINE_SCHEDULE`` and ``TFDIST_PIPELINE_LAYER_COSTS`` (a JSON file of per-layer costs;
the user's own, never written by the launcher).

Example:
    >>> config = PipelineConfig(stages=2, micro_batches=4, schedule="1f1b")
    >>> config.env()
    {'TFDIST_PIPELINE_STAGES': '2', 'TFDIST_PIPELINE_MICRO_BATCHES': '4', \
'TFDIST_PIPELINE_SCHEDULE': '1f1b'}
    >>> PipelineConfig.from_env(config.env()) == config
    True
    >>> PipelineConfig.from_env({"TFDIST_PIPELINE_STAGES": "3"}, stages=2).stages
    2
    >>> config.replicas(processes=6)
    3
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tfdist.core.traits import (
    PIPELINE_BATCH_NORM_ENV,
    PIPELINE_CHUNKS_ENV,
    PIPELINE_MICRO_BATCHES_ENV,
    PIPELINE_SCHEDULE_ENV,
    PIPELINE_STAGES_ENV,
)
from tfdist.errors import StrategyConfigError, format_error
from tfdist.options import check_positive_number
from tfdist.pipeline.layout import check_processes
from tfdist.pipeline.partition import check_micro_batches, check_stages, read_layer_costs
from tfdist.pipeline.schedule import SCHEDULES, PipelineSchedule, schedule_class

__all__ = ["PipelineConfig", "STAGES_ENV", "MICRO_BATCHES_ENV", "SCHEDULE_ENV",
           "LAYER_COSTS_ENV", "CHUNKS_ENV", "BATCH_NORM_ENV", "WEIGHT_GRADIENTS_ENV",
           "BATCH_NORM_POLICIES", "WEIGHT_GRADIENTS"]

STAGES_ENV = PIPELINE_STAGES_ENV
MICRO_BATCHES_ENV = PIPELINE_MICRO_BATCHES_ENV
SCHEDULE_ENV = PIPELINE_SCHEDULE_ENV
CHUNKS_ENV = PIPELINE_CHUNKS_ENV
BATCH_NORM_ENV = PIPELINE_BATCH_NORM_ENV
LAYER_COSTS_ENV = "TFDIST_PIPELINE_LAYER_COSTS"
"""A JSON file of measured per-layer costs (``tfdist-advise --json``) to balance stages by."""
BATCH_NORM_POLICIES = ("refuse", "per_micro_batch")
"""``PipelineConfig.batch_norm``'s values."""
WEIGHT_GRADIENTS_ENV = "TFDIST_PIPELINE_WEIGHT_GRADIENTS"
WEIGHT_GRADIENTS = ("sum", "whole_batch")
"""How a stage gets its weight gradients: summed over micro-batches as they come (the default),
or once per step over the replica batch (`tfdist.pipeline.batch_weights`)."""
WHOLE_BATCH_SCHEDULES = ("gpipe", "1f1b")


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError(raw)
    return value


def _policy(raw: str) -> str:
    if raw not in BATCH_NORM_POLICIES:
        raise ValueError(raw)
    return raw


def _from_env(environ: Mapping[str, str], name: str, cast: Callable[[str], Any],
              expected: str) -> Any:
    """``$name`` cast, or None when unset or empty; raises naming the variable if invalid."""
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return cast(raw)
    except ValueError:
        raise StrategyConfigError(format_error(
            f"${name} is not valid.", received=f"{name}={raw!r}", expected=expected,
            fix=f"unset {name}, or set it to {expected}")) from None


def _names(name: str, value: Sequence[str] | None, what: str, example: str, fix: str
           ) -> tuple[str, ...] | None:
    """``value`` as a tuple of strings (None stays None); raises unless it is a list of them."""
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise StrategyConfigError(format_error(
            f"{name} must be a list of {what}.", received=repr(value),
            expected=f"e.g. {example}", fix=fix))
    return tuple(value)


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Everything a pipeline is configured by; checked when made.

    Attributes:
        stages: K, the number of stages.
        micro_batches: M, micro-batches per replica batch (the global batch is cut into
            D x M equal parts).
        schedule: A name of `tfdist.pipeline.schedule.SCHEDULES`: ``"gpipe"`` (all forwards,
            then all backwards), ``"1f1b"`` (one forward, one backward: a stage keeps at most
            K - stage micro-batches' activations), ``"interleaved"`` (Megatron's interleaved
            1F1B: each process holds ``chunks`` pieces of the model, the bubble shrinks
            v-fold) or ``"zb-h1"`` (zero bubble: 1F1B's backwards split, the weight gradients
            moved into the bubble).
        chunks: v, the model chunks each process holds (a multi-chunk schedule such as
            ``"interleaved"`` only; else 1).
        split_points: The first layer of each stage but the first (layer names), or None to
            balance the stages by ``layer_costs``, else by parameter count.
        layer_costs: Measured seconds per layer, or None. A JSON file's path (a list, or
            ``tfdist-advise --json``'s object) is read when the config is made.
        timeout: Deadline in seconds of each transfer between stages, or None (none: a dead
            peer then ends the job through the launcher).
        devices: One local device per stage, to hold all K stages in one process, or None
            (one stage per process; in a single process with K > 1, the first K local devices).
        batch_norm: What a BatchNormalization anywhere in the model (nested layers and models
            included) gets when M > 1: ``"refuse"`` (the default: its statistics would be per
            micro-batch, unlike one device) or ``"per_micro_batch"`` (GPipe's behaviour: each
            micro-batch normalised by its own statistics, moving averages updated M times).
        arithmetic_optimization: Keep Grappler's arithmetic optimizer on in stage processes
            (False: off, else the last stage keeps every micro-batch's gradients to the end
            of the step; measured in docs/strategies/pipeline.md).
        recompute: Keep only the stage inputs of micro-batches in flight and run each
            stage's forward again in its backward (activation recomputation).
        weight_gradients: ``"sum"`` (the default: each micro-batch's weight gradients added
            into a sum held through the step) or ``"whole_batch"`` (computed once per step
            over the replica batch, one more forward of the stage: no sum held, so a stage
            trained with SGD peaks at about its weights plus a layer's gradient; ``gpipe`` or
            ``1f1b``, without ``recompute``; `tfdist.pipeline.batch_weights`).

    Raises:
        StrategyConfigError: a value of the wrong type or range; the message names it, what
            was expected and the fix.

    Example:
        >>> PipelineConfig(stages=0)
        Traceback (most recent call last):
        ...
        tfdist.errors.StrategyConfigError: stages must be a positive int. Received: stages=0. \
Expected: an int >= 1 (the number of pipeline stages, K). Fix: pass stages=2 (or tfdist-launch \
--stages 2)
    """

    stages: int = 1
    micro_batches: int = 1
    schedule: str = "gpipe"
    chunks: int = 1
    split_points: tuple[str, ...] | None = None
    layer_costs: tuple[float, ...] | None = None
    timeout: float | None = None
    devices: tuple[str, ...] | None = None
    batch_norm: str = "refuse"
    arithmetic_optimization: bool = False
    recompute: bool = False
    weight_gradients: str = "sum"

    def __post_init__(self) -> None:
        check_stages(self.stages)
        check_micro_batches(self.micro_batches)
        self._check_chunks()
        if self.batch_norm not in BATCH_NORM_POLICIES:
            raise StrategyConfigError(format_error(
                "Unknown batch_norm policy.", received=f"batch_norm={self.batch_norm!r}",
                expected=f"one of {', '.join(BATCH_NORM_POLICIES)}",
                fix="use 'refuse' (one device's result or an error) or 'per_micro_batch' "
                "(GPipe's per-micro-batch statistics)"))
        self._check_weight_gradients()
        self._set("split_points", _names(
            "split_points", self.split_points, "layer names", "['dense_3']",
            "pass a list of the first layer of each stage"))
        costs = self.layer_costs
        self._set("layer_costs", None if not costs else tuple(read_layer_costs(costs)))
        self._set("timeout", check_positive_number("timeout_seconds", self.timeout))
        self._set("devices", _names(
            "devices", self.devices, "device names", "['/gpu:0', '/gpu:1']",
            "pass a list of local device names, one per stage"))

    @property
    def schedule_class(self) -> type[PipelineSchedule]:
        """The class of ``schedule`` (`tfdist.pipeline.schedule.SCHEDULES`)."""
        return schedule_class(self.schedule)

    def _check_chunks(self) -> None:
        cls = self.schedule_class  # raises on an unknown name
        cls.check(self.stages, self.micro_batches, self.chunks)
        if cls.multi_chunk and self.devices is not None:
            raise StrategyConfigError(format_error(
                f"The {self.schedule} schedule runs one process per stage.",
                received=f"devices={self.devices!r}", expected="devices=None",
                fix="drop devices, or use schedule='1f1b'"))

    def _check_weight_gradients(self) -> None:
        if self.weight_gradients not in WEIGHT_GRADIENTS:
            raise StrategyConfigError(format_error(
                "Unknown weight_gradients.", received=f"weight_gradients={self.weight_gradients!r}",
                expected=f"one of {', '.join(WEIGHT_GRADIENTS)}",
                fix="use 'sum' (the default) or 'whole_batch' (less memory, one more forward)"))
        if self.weight_gradients == "sum":
            return
        if self.schedule not in WHOLE_BATCH_SCHEDULES or self.recompute:
            raise StrategyConfigError(format_error(
                "weight_gradients='whole_batch' runs with the gpipe or 1f1b schedule, without "
                "recompute.", received=f"schedule={self.schedule!r}, recompute={self.recompute}",
                expected=f"schedule in {WHOLE_BATCH_SCHEDULES}, recompute=False",
                fix="use schedule='1f1b' and drop recompute, or weight_gradients='sum'"))
        if self.batch_norm != "refuse":
            raise StrategyConfigError(format_error(
                "weight_gradients='whole_batch' runs the stage on the whole replica batch, "
                "which per-micro-batch BatchNormalization statistics cannot.",
                received=f"batch_norm={self.batch_norm!r}", expected="batch_norm='refuse'",
                fix="use weight_gradients='sum' with batch_norm='per_micro_batch'"))

    @property
    def pieces(self) -> int:
        """The pieces the model is cut into: K x v."""
        return self.stages * self.chunks

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # normalising a frozen instance, once

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        stages: int | None = None,
        micro_batches: int | None = None,
        schedule: str | None = None,
        chunks: int | None = None,
        split_points: Sequence[str] | None = None,
        layer_costs: Sequence[float] | str | os.PathLike[str] | None = None,
        timeout: float | None = None,
        devices: Sequence[str] | None = None,
        batch_norm: str | None = None,
        arithmetic_optimization: bool | None = None,
        recompute: bool | None = None,
        weight_gradients: str | None = None,
    ) -> PipelineConfig:
        """The config of the given arguments; one left None comes from the launcher's variable
        in ``environ`` (default ``os.environ``), else its default.

        Raises:
            StrategyConfigError: a variable that does not parse, or a bad value.
        """
        environ = os.environ if environ is None else environ
        read = {
            "stages": _from_env(environ, STAGES_ENV, _positive_int, "an int >= 1"),
            "micro_batches": _from_env(environ, MICRO_BATCHES_ENV, _positive_int, "an int >= 1"),
            "schedule": _from_env(environ, SCHEDULE_ENV, str,
                                  f"one of {', '.join(SCHEDULES)}"),
            "chunks": _from_env(environ, CHUNKS_ENV, _positive_int, "an int >= 1"),
            "layer_costs": _from_env(environ, LAYER_COSTS_ENV, str, "a JSON file's path"),
            "batch_norm": _from_env(environ, BATCH_NORM_ENV, _policy,
                                    f"one of {', '.join(BATCH_NORM_POLICIES)}"),
            "weight_gradients": _from_env(environ, WEIGHT_GRADIENTS_ENV, str,
                                          f"one of {', '.join(WEIGHT_GRADIENTS)}"),
        }
        given = {"stages": stages, "micro_batches": micro_batches, "schedule": schedule,
                 "chunks": chunks,
                 "split_points": split_points, "layer_costs": layer_costs, "timeout": timeout,
                 "devices": devices, "batch_norm": batch_norm,
                 "arithmetic_optimization": arithmetic_optimization, "recompute": recompute,
                 "weight_gradients": weight_gradients}
        chosen = {name: value if value is not None else read.get(name)
                  for name, value in given.items()}
        return cls(**{name: value for name, value in chosen.items() if value is not None})

    def env(self) -> dict[str, str]:
        """The variables that carry K, M and the schedule to a job's tasks (the launcher's
        options; `from_env` reads them back)."""
        return {STAGES_ENV: str(self.stages), MICRO_BATCHES_ENV: str(self.micro_batches),
                SCHEDULE_ENV: self.schedule,
                **({CHUNKS_ENV: str(self.chunks)} if self.chunks > 1 else {}),
                **({BATCH_NORM_ENV: self.batch_norm} if self.batch_norm != "refuse" else {})}

    def replicas(self, processes: int) -> int:
        """D, the pipeline replicas of a job of ``processes`` processes with one stage each.

        Raises:
            StrategyConfigError: ``processes`` is not a multiple of K.
        """
        return check_processes(processes, self.stages)
