"""The engine's interface: what a stage model and the custom loop call on the engine of this
process's stages (`PipelineEngine`), a stage's losses besides the compiled one (`LossTerms`),
and what one stage's step has built so far (`StageStep`, which the op handlers fill).
`tfdist.pipeline.engine` implements it (and re-exports the three names).

Example:
    >>> LossTerms(weights=lambda: None, added=lambda: None).weights() is None
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from tfdist.pipeline.layout import PipelineLayout
from tfdist.pipeline.transport import EVALUATE, REDUCE, TRAIN

__all__ = ["LossFn", "LossTerms", "PipelineEngine", "StageStep"]

LossFn = Callable[[Any, Any, Any], Any]
"""``loss_fn(y, y_pred, sample_weight)`` -> the mean loss of a micro-batch."""


@dataclasses.dataclass(frozen=True)
class LossTerms:
    """A stage's losses besides the compiled loss, as functions the engine calls in its graph.

    Attributes:
        weights: The sum of the losses that depend on variables only (weight regularizers),
            or None if there are none; called once per step.
        added: The sum of the losses the stage's last call added (activity regularizers,
            ``add_loss`` in ``call``), or None; called right after each call.

    Example:
        >>> terms = LossTerms(weights=lambda: None, added=lambda: 0.5)
        >>> terms.added()
        0.5
    """

    weights: Callable[[], Any]
    added: Callable[[], Any]


@dataclasses.dataclass
class StageStep:
    """What one stage's step has built so far: per micro-batch tapes, inputs, outputs and losses,
    the summed gradients, the losses its calls added (already divided by M), the sends to tie
    to the step's outputs, and the last op (``chain``). A split backward keeps each micro-batch's
    weight gradients and the ops only they need (``deferred``) from its I until its W."""

    call: Callable[[Any], Any]
    variables: list[Any]
    loss_fn: LossFn
    rows: Any
    xs: list[Any] | None
    ys: list[Any] | None
    weights: list[Any] | None
    grads: list[Any]
    terms: LossTerms | None = None
    added: dict[int, Any] = dataclasses.field(default_factory=dict)
    tapes: dict[int, Any] = dataclasses.field(default_factory=dict)
    inputs: dict[int, Any] = dataclasses.field(default_factory=dict)
    outputs: dict[int, Any] = dataclasses.field(default_factory=dict)
    losses: dict[int, Any] = dataclasses.field(default_factory=dict)
    sends: list[Any] = dataclasses.field(default_factory=list)
    chain: list[Any] = dataclasses.field(default_factory=list)
    deferred: dict[int, Any] = dataclasses.field(default_factory=dict)


class PipelineEngine(Protocol):
    """What a stage model (`tfdist.pipeline.keras_model`) and `PipelineStrategy.train_step` call
    on the engine of this process's stages: the one interface of the pipeline's two modes.

    `StageEngine` implements it for a process that holds one stage (its neighbours in other
    processes); `tfdist.pipeline.local.LocalPipeline` for a process that holds all K stages on
    its devices. ``calls``, ``variables`` and ``terms`` are what the model's ``stage_calls``,
    ``stage_variables`` and ``stage_loss_terms`` give: one stage's, or a list of K.
    """

    @property
    def layout(self) -> PipelineLayout:
        """This process's place (``layout.is_last``: it holds the last stage and the loss)."""
        ...

    def train(self, calls: Any, variables: Any, x: Any, y: Any, loss_fn: LossFn,
              sample_weight: Any = None, terms: Any = None, /
              ) -> tuple[Any, list[Any], list[Any]]:
        """One training step: ``(loss, gradients, outputs)`` (see `StageEngine.train`)."""
        ...

    def forward(self, calls: Any, x: Any, phase: int = EVALUATE, terms: Any = None, /
                ) -> tuple[list[Any], Any | None]:
        """A forward-only pass: ``(outputs, terms)`` (see `StageEngine.forward`)."""
        ...

    def replica_rows(self, tensor: Any) -> Any:
        """This replica's rows of a global batch."""
        ...

    def average_over_replicas(self, tensors: Sequence[Any], kind: int = REDUCE,
                              phase: int = TRAIN) -> list[Any]:
        """The mean of each tensor over this stage's D replicas."""
        ...

    def share(self, values: Any | None, shape: Any, dtype: Any, index: int = 0,
              phase: int = TRAIN, sized: bool = False) -> Any:
        """The last stage's ``values`` on every stage of this replica (``sized``: a shape
        that changes from batch to batch, on a sized key)."""
        ...
