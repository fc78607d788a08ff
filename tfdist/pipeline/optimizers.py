"""A stage's optimizer with one device's semantics: each Keras optimizer option is either exact
across stages or refused before training, naming the option (`check_optimizer`).

Exact with nothing to do, because the option acts on each variable alone and every stage applies
the whole (replica-averaged) gradient of its own variables: ``clipnorm`` (per variable),
``clipvalue``, ``weight_decay`` and its exclusions, ``use_ema`` (its moving averages and their
swap at the end of ``fit``), ``gradient_accumulation_steps`` (every stage counts the same
iterations).

Exact with help: ``global_clipnorm`` depends on every gradient of the model. A stage computes the
squared sum of its gradients, one all-reduce over the stages of its pipeline replica gives the
whole model's norm, and the stage clips with that norm as its Keras would (`apply_gradients`).

Refused: a loss-scaling optimizer (``LossScaleOptimizer``, mixed precision) and Keras 3's
``loss_scale_factor``: the pipeline computes the loss and gradients itself and does not scale
them, and the all-finite check would have to agree across stages. ``global_clipnorm`` together
with ``gradient_accumulation_steps`` (the norm of the accumulated gradients is taken inside the
optimizer's own update).

Example:
    >>> import keras
    >>> check_optimizer(keras.optimizers.Adam(clipnorm=1.0), spans_processes=True)
    >>> check_optimizer(keras.optimizers.Adam(loss_scale_factor=8.0), spans_processes=True)
    Traceback (most recent call last):
    ...
    tfdist.errors.StrategyConfigError: The pipeline cannot apply loss_scale_factor=8.0 as one \
device would. Received: loss_scale_factor=8.0 (Adam). Expected: an optimizer without \
loss_scale_factor. Fix: leave loss_scale_factor unset (float32 training needs no loss scaling)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tensorflow as tf
from tensorflow.python.ops import collective_ops

from tfdist.errors import StrategyConfigError, format_error
from tfdist.parallel.keys import REDUCE, TRAIN, instance_key
from tfdist.parallel.mesh import PIPE

__all__ = ["check_optimizer", "apply_gradients", "global_norm_across_stages",
           "EXACT_OPTIONS", "REFUSED_OPTIONS"]

EXACT_OPTIONS = ("clipnorm", "clipvalue", "global_clipnorm", "weight_decay", "use_ema",
                 "gradient_accumulation_steps")
"""Optimizer options that give one device's result under the pipeline."""
REFUSED_OPTIONS = ("LossScaleOptimizer", "loss_scale_factor",
                   "global_clipnorm with gradient_accumulation_steps")
"""What `check_optimizer` refuses."""
NORM_MICRO_BATCH = 1
"""The squared norm's all-reduce uses REDUCE's instance keys of micro-batch 1 (the gradients'
use micro-batch 0)."""


def _refuse(option: str, value: Any, optimizer: Any, why: str, fix: str) -> StrategyConfigError:
    return StrategyConfigError(format_error(
        f"The pipeline cannot apply {option}={value!r} as one device would{why}.",
        received=f"{option}={value!r} ({type(optimizer).__name__})",
        expected=f"an optimizer without {option}", fix=fix))


def _is_loss_scaling(optimizer: Any) -> bool:
    return any("LossScaleOptimizer" in cls.__name__ for cls in type(optimizer).__mro__)


def check_optimizer(optimizer: Any, spans_processes: bool) -> None:
    """Raises before training for an option the pipeline cannot apply exactly.

    Args:
        optimizer: The stage's Keras optimizer (either Keras).
        spans_processes: Whether the model's stages are in several processes (K > 1, one stage
            per process): only then does a global norm need the other stages.

    Raises:
        StrategyConfigError: naming the option, why and the fix.
    """
    if _is_loss_scaling(optimizer):
        raise _refuse(
            "LossScaleOptimizer", True, optimizer,
            ": the pipeline differentiates an unscaled loss, and the all-finite check would "
            "have to agree across stages", "train in float32 (mixed_precision policy "
            "'float32') without a LossScaleOptimizer, or use another strategy for mixed "
            "precision")
    factor = getattr(optimizer, "loss_scale_factor", None)
    if factor is not None:
        raise _refuse("loss_scale_factor", factor, optimizer, "",
                      "leave loss_scale_factor unset (float32 training needs no loss scaling)")
    steps = getattr(optimizer, "gradient_accumulation_steps", None)
    if spans_processes and steps and getattr(optimizer, "global_clipnorm", None):
        raise _refuse(
            "global_clipnorm", optimizer.global_clipnorm, optimizer,
            f" together with gradient_accumulation_steps={steps}: the norm of the accumulated "
            "gradients is taken inside the optimizer's update",
            "use clipnorm (per variable, exact) or drop gradient_accumulation_steps")


def _squared_sum(gradients: Sequence[Any]) -> Any:
    """Sum of squares of every gradient's entries (an ``IndexedSlices``'s values, as both
    Kerases' global norms take them)."""
    parts = [tf.reduce_sum(tf.square(tf.cast(g.values if isinstance(g, tf.IndexedSlices)
                                             else g, tf.float32)))
             for g in gradients if g is not None]
    return tf.add_n(parts) if parts else tf.zeros([])


def global_norm_across_stages(gradients: Sequence[Any], engine: Any) -> Any:
    """The L2 norm of the whole model's gradients: this stage's squared sum, summed over the
    stages of this replica with one all-reduce (the gradients are already replica means)."""
    group = engine.layout.group(PIPE)
    total = _squared_sum(gradients)
    if group.size > 1:
        total = collective_ops.all_reduce_v2(
            total, group_size=group.size, group_key=group.key,
            instance_key=instance_key(REDUCE, NORM_MICRO_BATCH, 0, TRAIN), merge_op="Add",
            final_op="Id", timeout=getattr(engine, "timeout", 0.0))
    return tf.sqrt(total)


def _clip_like_keras(gradients: list[Any], limit: float, norm: Any, optimizer: Any) -> list[Any]:
    """``gradients`` clipped to the global norm ``limit`` given the model's ``norm``, with the
    arithmetic of the optimizer's own Keras (Keras 3 multiplies, densifying an
    ``IndexedSlices``; tf-keras uses ``tf.clip_by_global_norm``, which keeps it)."""
    if type(optimizer).__module__.startswith("tf_keras"):
        return tf.clip_by_global_norm(gradients, limit, use_norm=norm)[0]
    norm = tf.cast(norm, gradients[0].dtype) if gradients else norm
    scale = limit * tf.minimum(1.0 / norm, 1.0 / limit)
    scale = scale + (norm - norm)  # NaN for a non-finite norm, as Keras
    return [None if g is None else g * scale for g in gradients]


@contextlib.contextmanager
def _without(optimizer: Any, option: str) -> Iterator[None]:
    """``optimizer.<option>`` set to None while the update is built (the clip is done)."""
    value = getattr(optimizer, option)
    setattr(optimizer, option, None)
    try:
        yield
    finally:
        setattr(optimizer, option, value)


def apply_gradients(optimizer: Any, engine: Any, gradients: Sequence[Any],
                    variables: Sequence[Any],
                    combine: Callable[[list[Any]], list[Any]] | None = None) -> None:
    """Averages a stage's summed gradients over its replicas and applies them as one device's
    optimizer would apply the whole model's (inside the step's ``tf.function``).

    ``combine`` runs on the replica-averaged gradients before any clipping (e.g. summing the
    gradients of a weight shared across stages)."""
    grads = engine.average_over_replicas(list(gradients))
    if combine is not None:
        grads = combine(grads)
    limit = getattr(optimizer, "global_clipnorm", None)
    if not (limit and limit > 0) or engine.layout.holds_all:
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        return
    grads = _clip_like_keras(grads, limit, global_norm_across_stages(grads, engine), optimizer)
    with _without(optimizer, "global_clipnorm"):
        optimizer.apply_gradients(zip(grads, variables, strict=True))
