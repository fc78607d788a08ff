"""A functional Keras graph read into plain data: its layer calls in a topological order.

`read_graph` walks a built model (Keras 3 or tf-keras; Sequential or functional) from its
outputs back to its inputs and lists every layer call (a `GraphNode`) after the calls that
produce its inputs. Nested models (a functional block, a Sequential inside a functional model)
are flattened: their layers' calls join the list, their inputs and outputs become the tensors
of the enclosing call. Tensors are numbered in the order they are made: the model's inputs
first, then each call's outputs. A layer called several times (shared weights, a tied
embedding) is one layer with several nodes.

`replay` makes the calls of some nodes on new symbolic tensors, which is how a stage's
functional model is rebuilt from layer configs (`tfdist.pipeline.stage`).

Example:
    >>> from tfdist.core.flavour import get_keras
    >>> keras = get_keras()
    >>> x = keras.Input((4,), name="x")
    >>> a = keras.layers.Dense(4, name="a")(x)
    >>> out = keras.layers.Add(name="add")([x, keras.layers.Dense(4, name="b")(a)])
    >>> graph = read_graph(keras.Model(x, out))
    >>> [graph.layers[n.layer].name for n in graph.nodes], graph.inputs, graph.outputs
    (['a', 'b', 'add'], (0,), (3,))
    >>> [n.inputs for n in graph.nodes]
    [(0,), (1,), (0, 2)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from tfdist.errors import StrategyConfigError, format_error

__all__ = ["TensorRef", "GraphNode", "Graph", "read_graph", "replay", "map_structure"]


@dataclasses.dataclass(frozen=True)
class TensorRef:
    """Tensor ``id`` in a node's call arguments (where the symbolic tensor was)."""

    id: int


@dataclasses.dataclass(frozen=True, eq=False)
class GraphNode:
    """One layer call.

    Attributes:
        layer: Index of the called layer in `Graph.layers`.
        inputs: The tensors it reads, in argument order (each once).
        outputs: The tensors it makes, in its output's flattened order.
        args: The call's positional arguments, tensors as `TensorRef`.
        kwargs: Its keyword arguments, tensors as `TensorRef`.
        structured: Whether the output is a structure (a list) rather than one tensor.
    """

    layer: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    structured: bool = False


@dataclasses.dataclass(frozen=True, eq=False)
class Graph:
    """A model's layers, their calls in a topological order, and its tensors.

    Attributes:
        layers: Each distinct layer (live objects), in the order of first call.
        nodes: The calls.
        tensors: Each tensor's symbolic value (live), by id.
        inputs: The model's input tensors (ids ``0..n-1``).
        outputs: The model's output tensors.
    """

    layers: tuple[Any, ...]
    nodes: tuple[GraphNode, ...]
    tensors: tuple[Any, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


def map_structure(fn: Callable[[Any], Any], value: Any, leaf: Callable[[Any], bool]) -> Any:
    """``value`` with every ``leaf`` replaced by ``fn(leaf)`` (lists, tuples, dicts walked).

    Example:
        >>> map_structure(lambda v: v * 2, [1, ("a", {"k": 3})], lambda v: isinstance(v, int))
        [2, ('a', {'k': 6})]
    """
    if leaf(value):
        return fn(value)
    if isinstance(value, dict):
        return {k: map_structure(fn, v, leaf) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(map_structure(fn, v, leaf) for v in value)
    return value


def _flatten(value: Any, leaf: Callable[[Any], bool]) -> list[Any]:
    found: list[Any] = []
    map_structure(found.append, value, leaf)
    return found


def _is_symbolic(value: Any) -> bool:
    return hasattr(value, "_keras_history")


def _node_of(tensor: Any) -> tuple[Any, Any]:
    history = tensor._keras_history
    layer = history[0]
    return layer, layer._inbound_nodes[history[1]]


def _call_arguments(node: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A node's ``(args, kwargs)`` in either Keras."""
    arguments = getattr(node, "arguments", None)
    if arguments is not None:  # Keras 3
        return tuple(arguments.args), dict(arguments.kwargs)
    return tuple(node.call_args), dict(node.call_kwargs)  # tf-keras


def _is_model(layer: Any) -> bool:
    return bool(getattr(layer, "inputs", None)) and bool(getattr(layer, "outputs", None)) \
        and hasattr(layer, "layers") and type(layer).__name__ != "InputLayer"


class _Reader:
    """The walk behind `read_graph`: one id per tensor of a scope, one node per layer call."""

    def __init__(self) -> None:
        self.layers: list[Any] = []
        self.layer_index: dict[int, int] = {}
        self.nodes: list[GraphNode] = []
        self.tensors: list[Any] = []

    def new_tensor(self, value: Any) -> int:
        self.tensors.append(value)
        return len(self.tensors) - 1

    def layer_id(self, layer: Any) -> int:
        if id(layer) not in self.layer_index:
            self.layer_index[id(layer)] = len(self.layers)
            self.layers.append(layer)
        return self.layer_index[id(layer)]

    def walk(self, model: Any, input_ids: Sequence[int]) -> list[int]:
        """Lists ``model``'s calls (its inputs already tensors ``input_ids``); returns the ids of
        its outputs."""
        scope = {id(t): i for t, i in zip(model.inputs, input_ids, strict=True)}
        return [self.visit(t, scope) for t in model.outputs]

    def visit(self, tensor: Any, scope: dict[int, int]) -> int:
        stack = [tensor]
        while stack:
            top = stack[-1]
            if id(top) in scope:
                stack.pop()
                continue
            layer, node = _node_of(top)
            if type(layer).__name__ == "InputLayer":
                raise _unreachable_input(layer)
            args, kwargs = _call_arguments(node)
            pending = [t for t in _flatten((args, kwargs), _is_symbolic) if id(t) not in scope]
            if pending:
                stack.extend(reversed(pending))
                continue
            self.expand(layer, node, args, kwargs, scope)
            stack.pop()
        return scope[id(tensor)]

    def expand(self, layer: Any, node: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
               scope: dict[int, int]) -> None:
        """Records ``layer``'s call (all of its outputs at once), or flattens a nested model."""
        inputs = [scope[id(t)] for t in _flatten((args, kwargs), _is_symbolic)]
        outputs = _flatten(node.outputs, _is_symbolic)
        if _is_model(layer):
            # a nested model's inputs in its own order: Keras flattens a dict by sorted keys
            ordered = [scope[id(t)] for t in _flatten(_sorted_dicts((args, kwargs)),
                                                       _is_symbolic)]
            inner = self.walk(layer, _dedupe_like(ordered, len(layer.inputs)))
            for tensor, tid in zip(outputs, inner, strict=True):
                scope[id(tensor)] = tid
            return
        ids = [self.new_tensor(t) for t in outputs]
        for tensor, tid in zip(outputs, ids, strict=True):
            scope[id(tensor)] = tid
        refs = map_structure(lambda t: TensorRef(scope[id(t)]), (args, kwargs), _is_symbolic)
        self.nodes.append(GraphNode(
            layer=self.layer_id(layer), inputs=tuple(dict.fromkeys(inputs)), outputs=tuple(ids),
            args=refs[0], kwargs=refs[1], structured=isinstance(node.outputs, (list, tuple))))


def _sorted_dicts(value: Any) -> Any:
    """``value`` with every dict's items in sorted key order (how both Kerases flatten the
    inputs of a model called on a dict, a KerasHub task model calling its backbone).

    Example:
        >>> _sorted_dicts(({"token_ids": 1, "padding_mask": 2},))
        ({'padding_mask': 2, 'token_ids': 1},)
    """
    if isinstance(value, dict):
        return {k: _sorted_dicts(value[k]) for k in sorted(value)}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_sorted_dicts(v) for v in value)
    return value


def _dedupe_like(inputs: list[int], count: int) -> list[int]:
    if len(inputs) != count:
        raise StrategyConfigError(format_error(
            "A nested model is called with a structure the pipeline cannot match to its inputs.",
            received=f"{len(inputs)} tensors for {count} inputs", expected="one per input",
            fix="call the nested model on a list of its inputs"))
    return inputs


def _unreachable_input(layer: Any) -> StrategyConfigError:
    return StrategyConfigError(format_error(
        f"The model's graph reaches input {layer.name!r}, which is not one of its inputs.",
        received=f"input layer {layer.name!r}", expected="a graph built from the model's inputs",
        fix="build the model as keras.Model(inputs=[...], outputs=...) from all its Inputs"))


def read_graph(model: Any) -> Graph:
    """The calls of a built Keras model, nested models flattened (see the module).

    Raises:
        StrategyConfigError: the model has no symbolic inputs and outputs (a subclassed model,
            or a Sequential without ``keras.Input``).
    """
    inputs, outputs = getattr(model, "inputs", None), getattr(model, "outputs", None)
    if not inputs or not outputs:
        raise StrategyConfigError(format_error(
            "The pipeline needs a model built from keras.Input tensors (Sequential or "
            "functional).",
            received=f"{type(model).__name__} without symbolic inputs/outputs",
            expected="keras.Sequential([keras.Input(shape), ...]) or keras.Model(inputs, "
            "outputs)",
            fix="start a Sequential with keras.Input(shape), or write the model as a "
            "functional keras.Model (a subclassed model's call cannot be split)"))
    reader = _Reader()
    ids = [reader.new_tensor(t) for t in inputs]
    out = reader.walk(model, ids)
    return Graph(layers=tuple(reader.layers), nodes=tuple(reader.nodes),
                 tensors=tuple(reader.tensors), inputs=tuple(ids), outputs=tuple(out))


def replay(nodes: Sequence[GraphNode], layers: Sequence[Any], values: dict[int, Any]) -> None:
    """Calls ``layers[node.layer]`` for each node on ``values`` (tensor id -> tensor, updated
    with every output)."""
    def value(ref: TensorRef) -> Any:
        return values[ref.id]

    def is_ref(v: Any) -> bool:
        return isinstance(v, TensorRef)

    for node in nodes:
        args = map_structure(value, node.args, is_ref)
        kwargs = map_structure(value, node.kwargs, is_ref)
        result = layers[node.layer](*args, **kwargs)
        produced = _flatten(result, _is_tensor) if node.structured else [result]
        for tid, tensor in zip(node.outputs, produced, strict=True):
            values[tid] = tensor


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")
