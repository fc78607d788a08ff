"""ZeRO stage 3's step layer by layer: each layer's weights gathered just before its forward and
again before its backward, dropped after each, and its gradient reduce-scattered to its owners
as soon as it is computed, so neither the whole model nor its whole gradient is ever resident.

A *unit* is the outermost layer that owns trainable weights of its own (with every weight of
its sublayers); `units` finds them. While `layerwise` is entered (the trace of a training step),
each unit's ``call`` runs as a `tf.custom_gradient` function of its floating inputs, this
process's pieces of its weights and a scalar *token*:

* forward: all-gather the unit's weights (once the inputs of the unit called before it exist:
  the gather overlaps that unit's forward, the prefetch, and is not made before it is needed),
  run the layer on them in a ``keras.StatelessScope``, write back the non-trainable
  variables it updated (batch statistics, seeds); the gathered weights die with the forward;
* backward (once the output's gradient of the unit differentiated before it exists, the same
  prefetch): all-gather them again, recompute the layer's
  forward from its saved inputs under a tape, with the non-trainable variables as they were
  before the forward (the same dropout mask), then reduce-scatter the weights' gradient
  (`tfdist.zero.engine.ZeroEngine.reduce_to_owners` of the unit's weights only): the gradient
  returned for each piece is already summed over the data axis and averaged.

The token is a trainable scalar the step differentiates the loss by: it makes every process run
every unit's backward (and its collectives), including a unit whose inputs are integers (an
embedding) and of which this process owns no piece.

The cost against gathering the whole model once: one more forward per layer (the recompute) and
the weights gathered twice (1.5x the replicated all-reduce's bytes, as ZeRO-3 moves). With the
prefetch, two units' gathered weights are resident at a time instead of one.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import keras
import tensorflow as tf

__all__ = ["Unit", "units", "layerwise", "scattering"]


@dataclasses.dataclass(frozen=True, eq=False)
class Unit:
    """One layer whose weights are gathered together.

    Attributes:
        layer: The Keras layer (its ``call`` is wrapped while `layerwise` is entered).
        variables: The numbers of its trainable weights among the engine's.
        state: Its non-trainable variables (and its sublayers'): seeds, batch statistics.
        token: The scalar the step differentiates by (see the module).
    """

    layer: Any
    variables: frozenset[int]
    state: tuple[Any, ...]
    token: tf.Variable


def units(model: Any, variables: Sequence[Any]) -> list[Unit] | None:
    """The model's units (outermost layers owning trainable weights), or None if some of
    ``variables`` belongs to no layer below the model (a weight of the model itself): the step
    then gathers the whole model at once."""
    number = {id(v): i for i, v in enumerate(variables)}
    found: list[Unit] = []

    def visit(layer: Any) -> None:
        own = [v for v in getattr(layer, "_trainable_variables", []) if id(v) in number]
        if own:
            subtree = frozenset(number[id(v)] for v in layer.trainable_variables
                                if id(v) in number)
            token = tf.Variable(0.0, trainable=True, name=f"zero_token_{len(found)}")
            found.append(Unit(layer, subtree, tuple(layer.non_trainable_variables), token))
            return
        for sub in getattr(layer, "_layers", []):
            visit(sub)

    for layer in getattr(model, "_layers", []):
        visit(layer)
    covered = [i for unit in found for i in unit.variables]
    if sorted(covered) != list(range(len(variables))):
        return None  # a weight of the model itself, or one shared by two units
    return found


@dataclasses.dataclass
class _Prefetch:
    """What the next unit's gathers wait for: the tensors the last unit called waited for
    (forward), and the last unit differentiated's output gradients (backward)."""

    forward: list[Any] = dataclasses.field(default_factory=list)
    backward: list[Any] = dataclasses.field(default_factory=list)

    def after(self, direction: str, own: list[Any]) -> list[Any]:
        """What a gather waits for: the previous unit's in ``direction``, else ``own``; and
        ``own`` is what the next one waits for."""
        previous = getattr(self, direction)
        setattr(self, direction, own)
        return previous or own


@contextlib.contextmanager
def layerwise(engine: Any, found: Sequence[Unit]) -> Iterator[None]:
    """Each unit's ``call`` gathers its weights and scatters its gradient (see the module)."""
    originals = []
    prefetch = _Prefetch()
    for unit in found:
        original = unit.layer.call
        originals.append((unit.layer, original if "call" in vars(unit.layer) else None))

        def call(*args: Any, _unit: Unit = unit, _call: Any = original, **kwargs: Any) -> Any:
            return _run_unit(engine, _unit, _call, args, kwargs, prefetch)

        object.__setattr__(unit.layer, "call", call)
    try:
        yield
    finally:
        for layer, own in originals:
            if own is None:
                object.__delattr__(layer, "call")
            else:
                object.__setattr__(layer, "call", own)


def _floating(value: Any) -> bool:
    return tf.is_tensor(value) and value.dtype.is_floating


def _run_unit(engine: Any, unit: Unit, call: Any, args: tuple, kwargs: dict,
              prefetch: _Prefetch) -> Any:
    """``call(*args, **kwargs)`` on the unit's gathered weights (a custom gradient)."""
    flat = tf.nest.flatten((args, kwargs))
    at = [i for i, value in enumerate(flat) if _floating(value)]
    waits = [value for value in flat if tf.is_tensor(value)]
    mine = engine.pieces_of(unit.variables)
    parts = [tf.convert_to_tensor(engine.pieces[k].value) for k in mine]
    before = [(v, tf.identity(tf.convert_to_tensor(v.value))) for v in unit.state]
    numbers = sorted(unit.variables)
    structure: list[Any] = []

    def run(inputs: Sequence[Any], whole: dict[int, Any], write_back: bool) -> list[Any]:
        values = list(flat)
        for i, value in zip(at, inputs, strict=True):
            values[i] = value
        a, k = tf.nest.pack_sequence_as((args, kwargs), values)
        mapping = [(engine.variables[i], whole[i]) for i in numbers] + before
        with keras.StatelessScope(state_mapping=mapping) as scope:
            out = call(*a, **k)
        if write_back:
            for variable, _ in before:
                variable.assign(scope.get_current_value(variable))
        structure[:] = [out]
        return tf.nest.flatten(out)

    def unit_call(*tensors: Any) -> Any:
        inputs, mine_parts = list(tensors[:len(at)]), list(tensors[len(at):-1])
        with tf.control_dependencies(prefetch.after("forward", waits)):
            whole = engine.gather_variables(unit.variables, mine_parts)
        outputs = run(inputs, whole, write_back=True)

        def grad(*upstream: Any) -> list[Any]:
            upstream = [tf.zeros_like(o) if u is None else u
                        for u, o in zip(upstream, outputs, strict=True)]
            with tf.control_dependencies(prefetch.after("backward", upstream)):
                again = engine.gather_variables(unit.variables, mine_parts)
            weights = [again[i] for i in numbers]
            with tf.GradientTape() as tape:
                tape.watch([*inputs, *weights])
                recomputed = run(inputs, again, write_back=False)
            found = tape.gradient(recomputed, [*inputs, *weights], output_gradients=upstream)
            of_inputs, of_weights = found[:len(inputs)], found[len(inputs):]
            owned = engine.reduce_to_owners(dict(zip(numbers, of_weights, strict=True)),
                                            only=unit.variables)
            # this layer's input gradient waits for its scatter: the scatters run one unit at a
            # time, the unit below's gather (prefetched) overlapping this one's recompute
            done = [g.values if isinstance(g, tf.IndexedSlices) else g
                    for g in owned if g is not None]
            with tf.control_dependencies(done):
                of_inputs = [None if g is None else tf.identity(g) for g in of_inputs]
            return [*of_inputs, *owned, tf.zeros([], unit.token.dtype)]

        return outputs, grad

    unit_call.__name__ = f"zero_unit_{unit.layer.name}"
    token = tf.convert_to_tensor(unit.token)
    outputs = tf.custom_gradient(unit_call)(*[flat[i] for i in at], *parts, token)
    return tf.nest.pack_sequence_as(structure[0], list(outputs))


def scattering(engine: Any, found: Sequence[Unit]) -> list[Any]:
    """Stage 2: each trainable weight's whole value (the engine's order), through an identity
    whose gradient is reduce-scattered to the owners unit by unit as soon as the unit's weights'
    gradients are complete, so the whole gradient is never resident. Run the model on them
    (``keras.StatelessScope``) inside the tape, and differentiate by the pieces and the units'
    tokens: the pieces' gradients come out summed and averaged."""
    whole: dict[int, Any] = {}
    for unit in found:
        numbers = sorted(unit.variables)
        values = [tf.convert_to_tensor(engine.variables[i].value) for i in numbers]
        parts = [tf.convert_to_tensor(engine.pieces[k].value)
                 for k in engine.pieces_of(unit.variables)]

        def scatter(*tensors: Any, _unit: Unit = unit, _numbers: list[int] = numbers) -> Any:
            def grad(*upstream: Any) -> list[Any]:
                owned = engine.reduce_to_owners(dict(zip(_numbers, upstream, strict=True)),
                                                only=_unit.variables)
                return [*([None] * len(_numbers)), *owned, tf.zeros([], _unit.token.dtype)]

            return [tf.identity(t) for t in tensors[:len(_numbers)]], grad

        scatter.__name__ = f"zero_scatter_{unit.layer.name}"
        out = tf.custom_gradient(scatter)(*values, *parts, tf.convert_to_tensor(unit.token))
        whole.update(zip(numbers, out, strict=True))
    return [whole[i] for i in range(len(engine.variables))]
