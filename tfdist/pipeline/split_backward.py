"""The two halves of a split backward (zero bubble, arXiv 2401.10241), as engine op handlers.

``"I"`` (`input_gradient_op`) differentiates micro-batch ``m``'s stage only with respect to its
input and sends that gradient to the previous stage at once: the critical path of the pipeline.
``"W"`` (`weight_gradient_op`), later, differentiates the same targets with the same upstream
gradients with respect to the stage's weights, from the same saved forward (the tape of the
forward, kept persistent until then), and adds them to the step's sums: the schedule places it
where the stage would otherwise wait. Together they compute exactly what one ``"B"`` computes.

Example:
    >>> from tfdist.pipeline.engine import OP_HANDLERS
    >>> OP_HANDLERS["I"] is input_gradient_op, OP_HANDLERS["W"] is weight_gradient_op
    (True, True)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import tensorflow as tf

from tfdist.pipeline import gradients

if TYPE_CHECKING:
    from tfdist.pipeline.engine import StageEngine, StageStep

__all__ = ["input_gradient_op", "weight_gradient_op"]


def input_gradient_op(engine: StageEngine, step: StageStep, m: int) -> Any:
    """I of micro-batch ``m``: receives the output's gradient (or takes the loss), sends the
    input's gradient back; keeps the tape and the heads for its W. Returns the op's marker."""
    tape, targets, heads = engine.backward_heads(step, m)
    step.tapes[m], step.heads[m] = tape, (targets, heads)
    if engine.layout.is_first:  # nothing to send: the op is the receive of its heads
        return tf.group(tf.nest.flatten(targets if heads is None else heads))
    inputs = engine.differentiable(step.inputs[m])
    result = tape.gradient(targets, inputs, output_gradients=heads)
    return engine.send_input_gradients(step, m, inputs, result)


def weight_gradient_op(engine: StageEngine, step: StageStep, m: int) -> Any:
    """W of micro-batch ``m``: the weight gradients of what its I differentiated, added to the
    step's sums; the tape is dropped. Returns the op's marker."""
    del engine
    tape = step.tapes.pop(m)
    targets, heads = step.heads.pop(m)
    gradients.accumulate(step.grads, tape.gradient(targets, step.variables,
                                                   output_gradients=heads))
    done = [g for g in step.grads if g is not None]
    return tf.group(done) if done else tf.no_op()
