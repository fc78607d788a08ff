"""Weight gradients over the whole replica batch, once per step (``weight_gradients=
"whole_batch"``), instead of summed over micro-batches (graph code, engine op handlers).

Summing keeps a sum of every weight's gradient from a stage's first backward to the end of the
step: with plain SGD, whose one-process step holds about one layer's gradient at a time, a
stage of half the model then peaks as high as the whole model does in one process. Here each
micro-batch's backward (``"B"``, `backward_op`) computes only what the pipeline needs at once,
the gradient of the stage's input (sent back), and keeps the gradient of the stage's outputs
(what the next stage sent, or the last stage's loss differentiated); `weight_gradients` then
runs the stage once more on the replica batch (the micro-batches' inputs put back together) and
differentiates it with those output gradients, put together too. That is the computation one
process makes on the whole batch (``x^T g`` over all rows, an embedding's rows in batch order),
and its gradients reach the optimizer one layer at a time, as they do in one process.

It costs one more forward of the stage per step, with the replica batch's activations during
that pass, and needs a stage whose forward gives each row the same result whatever rows it runs
with, and the same on a second run (no BatchNormalization with per-micro-batch statistics, no
Dropout or other layer with a random seed: `random_layers` finds them; the strategy refuses).

Example:
    >>> from tfdist.pipeline.engine import StageEngine
    >>> StageEngine.__dataclass_fields__["whole_batch_weights"].default
    False
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from tfdist.pipeline import gradients

if TYPE_CHECKING:
    from tfdist.pipeline.engine import StageEngine, StageStep

__all__ = ["backward_op", "weight_gradients", "random_layers"]


def _output_heads(engine: StageEngine, step: StageStep, m: int, tape: Any, targets: Any,
                  heads: Any, inputs: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """Micro-batch ``m``'s gradients of the stage's outputs (flattened; None where none) and
    of its differentiable ``inputs``."""
    outputs = tf.nest.flatten(step.outputs[m])
    if engine.layout.is_last:  # the loss, differentiated: its outputs' and inputs' gradients
        result = tape.gradient(targets, [*outputs, *inputs])
        return list(result[:len(outputs)]), list(result[len(outputs):])
    received = {id(t): g for t, g in zip(targets, heads, strict=True)}
    backs = tape.gradient(targets, list(inputs), output_gradients=heads) if inputs else []
    return [received.get(id(t)) for t in outputs], list(backs)


def backward_op(engine: StageEngine, step: StageStep, m: int) -> Any:
    """B of micro-batch ``m`` without its weight gradients: sends the input's gradient back,
    keeps the outputs' gradients for `weight_gradients`. Returns the op's marker."""
    layout = engine.layout
    inputs = [] if layout.is_first else engine.differentiable(step.inputs[m])
    tape, targets, heads = engine.backward_heads(step, m)
    outs, backs = _output_heads(engine, step, m, tape, targets, heads, inputs)
    step.deferred[m] = outs
    if layout.is_first:
        kept = [g for g in outs if g is not None]
        return tf.group(kept) if kept else tf.group(tf.nest.flatten(targets))
    return engine.send_input_gradients(step, m, inputs, backs)


def _joined(parts: Sequence[Sequence[Any]]) -> list[Any]:
    """Each position's tensors of every micro-batch, put back together in batch order (None
    where no micro-batch has one; zeros where only some have)."""
    joined = []
    for column in zip(*parts, strict=True):
        if all(t is None for t in column):
            joined.append(None)
            continue
        like = next(t for t in column if t is not None)
        joined.append(tf.concat([tf.zeros_like(like) if t is None else t for t in column], 0))
    return joined


def weight_gradients(engine: StageEngine, step: StageStep) -> None:
    """Runs the stage on the replica batch and adds its weight gradients, for the output
    gradients every B kept, into the step's sums (after the stage's last op)."""
    micro = engine.micro_batches
    inputs = _joined([tf.nest.flatten(step.inputs[m]) for m in range(micro)])
    # after the step's sends too: `finish` releases the gradients to the optimizer only then,
    # and gradients computed while a send is pending would all be held at once (the pipeline
    # memory test's last stage: +90-120 MB, 0.64-0.67 of one process, in one run of three)
    with tf.control_dependencies(step.sends + step.chain), tf.GradientTape() as tape:
        out = step.call(inputs)
        added = None if step.terms is None else step.terms.added()
    heads = _joined([step.deferred.pop(m) for m in range(micro)])
    pairs = [(t, g) for t, g in zip(tf.nest.flatten(out), heads, strict=True) if g is not None]
    targets, grads_in = [t for t, _ in pairs], [g for _, g in pairs]
    if added is not None:  # each micro-batch's added losses: a mean over its rows, over M
        targets.append(added)
        grads_in.append(tf.ones_like(added))
    gradients.accumulate(step.grads, tape.gradient(targets, step.variables,
                                                   output_gradients=grads_in))
    # step.chain stays the last B's marker: a gradient may reach the optimizer (and be freed)
    # as soon as it is computed, not after all of them


RANDOM_CONFIG_KEYS = ("seed",)
"""A layer whose config holds one of these draws random numbers in its training call (Dropout,
GaussianNoise, random augmentation): its second run would differ from its first."""


def random_layers(configs: Sequence[tuple[str, str, dict[str, Any]]]) -> list[str]:
    """The names of the layers (``(name, class name, serialized config)``) a second run would
    change: a random seed in the config, or a BatchNormalization.

    Example:
        >>> random_layers([("d", "Dropout", {"config": {"rate": 0.1, "seed": None}}),
        ...                ("h", "Dense", {"config": {"units": 2}})])
        ['d']
    """
    found = []
    for name, class_name, config in configs:
        inner = config.get("config", {}) if isinstance(config, dict) else {}
        if class_name == "BatchNormalization" or any(k in inner for k in RANDOM_CONFIG_KEYS):
            found.append(name)
    return found
