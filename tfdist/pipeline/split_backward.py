"""The two halves of a split backward (zero bubble, arXiv 2401.10241), as engine op handlers.

``"I"`` (`input_gradient_op`) builds micro-batch ``m``'s whole backward in one gradient call,
but sends only the gradient of the stage's input, at once: the critical path of the pipeline.
The ops that only the weight gradients need (each layer's ``x^T g``; the gradients flowing
between layers, which the input's gradient needs too, are computed by I) are kept aside
(`weight_only_ops`), and ``"W"`` (`weight_gradient_op`), later in the schedule, gives them a
control input on the op before it, so they run in W's place, then adds the gradients to the
step's sums. Together they compute exactly what one ``"B"`` computes, in the same ops, only
ordered: no part of the backward runs twice.

Example:
    >>> from tfdist.pipeline.engine import OP_HANDLERS
    >>> OP_HANDLERS["I"] is input_gradient_op, OP_HANDLERS["W"] is weight_gradient_op
    (True, True)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from tfdist.pipeline import gradients

if TYPE_CHECKING:
    from tfdist.pipeline.engine import StageEngine, StageStep

__all__ = ["input_gradient_op", "weight_gradient_op", "weight_only_ops"]


def _ops(tensors: Iterable[Any]) -> list[Any]:
    flat = tf.nest.flatten(list(tensors), expand_composites=True)
    return [t.op for t in flat if t is not None and hasattr(t, "op")]


def weight_only_ops(created: Sequence[Any], inputs: Sequence[Any],
                    weights: Sequence[Any]) -> list[Any]:
    """The ops among ``created`` that the ``weights`` gradients need and the ``inputs``
    gradients do not.

    Example:
        >>> graph = tf.Graph()
        >>> with graph.as_default():
        ...     g = tf.constant(1.0, name="g")
        ...     dx, dw = tf.multiply(g, 2.0, name="dx"), tf.multiply(g, 3.0, name="dw")
        >>> [op.name for op in weight_only_ops(graph.get_operations(), [dx], [dw])]
        ['dw']
    """
    mine = set(created)

    def ancestors(tensors: Sequence[Any]) -> set[Any]:
        seen: set[Any] = set()
        stack = _ops(tensors)
        while stack:
            op = stack.pop()
            if op in seen or op not in mine:
                continue
            seen.add(op)
            stack.extend(t.op for t in op.inputs)
            stack.extend(op.control_inputs)
        return seen

    shared = ancestors(inputs)
    return [op for op in created if op in ancestors(weights) and op not in shared]


def input_gradient_op(engine: StageEngine, step: StageStep, m: int) -> Any:
    """I of micro-batch ``m``: receives the output's gradient (or takes the loss), builds its
    backward, sends the input's gradient back; keeps the weight gradients for W. Returns the
    op's marker."""
    tape, targets, heads = engine.backward_heads(step, m)
    inputs = [] if engine.layout.is_first else engine.differentiable(step.inputs[m])
    graph = tf.compat.v1.get_default_graph()
    before = len(graph.get_operations())
    result = tape.gradient(targets, [*inputs, *step.variables], output_gradients=heads)
    backs, weights = result[:len(inputs)], result[len(inputs):]
    created = graph.get_operations()[before:]
    step.deferred[m] = (weights, weight_only_ops(created, backs, weights))
    if engine.layout.is_first:  # nothing to send: the op is the receive of its heads
        return tf.group(tf.nest.flatten(targets if heads is None else heads))
    return engine.send_input_gradients(step, m, inputs, backs)


def weight_gradient_op(engine: StageEngine, step: StageStep, m: int) -> Any:
    """W of micro-batch ``m``: its weight-only ops wait for the op before W; the gradients join
    the step's sums. Returns the op's marker."""
    del engine
    weights, ops = step.deferred.pop(m)
    before = [c if isinstance(c, tf.Operation) else c.op for c in step.chain]
    for op in ops:
        op._add_control_inputs([b for b in before if b is not op])  # noqa: SLF001
    gradients.accumulate(step.grads, weights)
    done = [g for g in step.grads if g is not None]
    return tf.group(done) if done else tf.no_op()
