"""A stage's call as one ``tf.function``, traced once and called on each micro-batch.

Inside the step's ``tf.function``, calling a Keras model M times writes M copies of its graph
(every layer traced M times: the first step of a 4-micro-batch pipeline took about 4 times as
long as one of 1). Called through one ``tf.function``, the step holds M call ops of one traced
function, and TensorFlow differentiates each with the same gradient function.

Example:
    >>> from tfdist.core.flavour import get_keras
    >>> keras = get_keras()
    >>> stage = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> adds_losses_in_calls(stage)
    False
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = ["adds_losses_in_calls", "stage_call", "traced_call"]


def adds_losses_in_calls(model: Any) -> bool:
    """Whether a layer of ``model`` adds a loss in its calls (an activity regularizer: its loss
    is read after the call, which a ``tf.function`` would keep inside its own graph)."""
    return any(getattr(layer, "activity_regularizer", None) is not None
               for layer in model._flatten_layers())  # noqa: SLF001


def traced_call(model: Any, training: bool) -> Any:
    """``model``'s call in ``training`` mode as one ``tf.function`` (made once per model and
    mode, kept on the model): the engine calls it on each micro-batch.

    Example:
        >>> from tfdist.core.flavour import get_keras
        >>> keras = get_keras()
        >>> stage = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> traced_call(stage, True) is traced_call(stage, True)
        True
    """
    calls = model.__dict__.setdefault("_pipeline_traced_calls", {})  # no Keras tracking
    if training not in calls:
        call = getattr(model, "_call_stage", None)
        calls[training] = tf.function(
            (lambda inputs: call(inputs, training)) if call is not None else
            (lambda inputs: model(inputs, training=training)), autograph=False,
            reduce_retracing=True, experimental_attributes={"_noinline": True})
    return calls[training]


def _gathers_per_call(model: Any) -> bool:
    """Under ZeRO stage 3 each call gathers its layers' weights on traced instance keys: one
    traced function called M times would run M collectives on one key in a step."""
    return getattr(getattr(model, "_pipeline_zero", None), "stage", 0) == 3


def stage_call(model: Any, config: Any, training: bool) -> Any:
    """What the engine calls on each micro-batch's inputs (a list): with M > 1, `traced_call`;
    else, for a stage whose layers add losses in their calls, or with ``whole_batch`` weight
    gradients (whose point is memory: the traced calls kept each micro-batch's forward for its
    gradient, a stage peaking at 278 MB against 178 MB), or under ZeRO stage 3 (each call
    gathers on keys of its own), the model's own call (``model._call_stage``). ``config`` is
    the strategy's `PipelineConfig`."""
    if config.micro_batches > 1 and config.weight_gradients != "whole_batch" \
            and not adds_losses_in_calls(model) and not _gathers_per_call(model):
        return traced_call(model, training)
    return lambda inputs: model._call_stage(inputs, training)  # noqa: SLF001
