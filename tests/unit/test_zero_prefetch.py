"""ZeRO stage 3's prefetch (`tfdist.zero.layerwise`): in the traced step, a layer's gather waits
for what the layer before it waited for, not for that layer's output, so the two overlap; and the
backward's gather of a layer does not wait for the gradient of the layer above it to be computed.
Traced on a group of one process (D=1, in this process): the graph's edges are what is checked."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def _reaches(source, target) -> bool:
    """Whether op ``target`` depends on op ``source`` (data or control edges)."""
    seen, stack = set(), [target]
    while stack:
        op = stack.pop()
        if op is source:
            return True
        if op.name not in seen:
            seen.add(op.name)
            stack.extend(t.op for t in op.inputs)
            stack.extend(op.control_inputs)
    return False


def test_each_gather_overlaps_the_layer_before_it_forward_and_backward(monkeypatch):
    import keras
    import tensorflow as tf

    from tfdist.parallel.mesh import ProcessGroup
    from tfdist.zero.engine import ZeroEngine
    from tfdist.zero.layerwise import layerwise, units

    model = keras.Sequential([keras.Input((4,))] + [
        keras.layers.Dense(4, activation="relu", name=f"d{i}") for i in range(3)])
    engine = ZeroEngine(model, 3, ProcessGroup(key=97, members=(0,), rank=0), 10.0)
    found = units(model, engine.variables)
    gather, markers = engine.gather_variables, []

    def marked(variables, parts):  # the gathered weights' ops, in the order they are made
        whole = gather(variables, parts)
        markers.append([t.op for t in whole.values()])
        return whole

    monkeypatch.setattr(engine, "gather_variables", marked)
    outputs = {}

    @tf.function
    def step(x):
        with tf.GradientTape() as tape, layerwise(engine, found):
            hidden = x
            for layer in model.layers:
                hidden = layer(hidden)
                outputs[layer.name] = hidden.op
            loss = tf.reduce_sum(hidden)
        return tape.gradient(loss, [u.token for u in found] + [p for p in engine.pieces])

    step.get_concrete_function(tf.TensorSpec([2, 4]))
    forward, backward = markers[:3], markers[3:]
    assert len(backward) == 3

    def waits(target, source):
        return any(_reaches(s, t) for s in source for t in target)

    # forward: layer 1's weights are gathered without waiting for layer 0's output, layer 2's
    # without layer 1's; but layer 2's after layer 0's (one layer ahead, not all at once)
    assert not waits(forward[1], [outputs["d0"]])
    assert not waits(forward[2], [outputs["d1"]])
    assert waits(forward[2], [outputs["d0"]])
    # backward (layers 2, 1, 0): layer 1's gather does not wait for layer 2's recompute on its
    # gathered weights, but layer 0's waits for layer 2's (one layer ahead)
    assert not waits(backward[1], backward[0])
    assert not waits(backward[2], backward[1])
    assert waits(backward[2], backward[0])
