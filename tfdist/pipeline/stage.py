"""A model described without its weights, and one stage of it built for real.

`describe_model` reads a Keras model (built, or built by a function inside `tfdist.compat.models`'s
`abstract_build`, which allocates no weights) into a `ModelSpec`: its graph of layer calls in a
topological order (`tfdist.pipeline.graph`, nested models flattened), each layer's config and
parameter count, each tensor's shape and dtype. `split_model` cuts the calls into stages; each
cut carries the tensors alive across it (`ModelSpec.cuts`). `build_stage` then builds a stage's
calls as a functional model from the configs (its inputs: the tensors of the cut before it),
so a stage process creates only its own stage's variables. `assemble` rebuilds the whole model
from the spec (for saving) and `stage_weights` takes a full model's weights per stage.

Example:
    >>> from tfdist.core.flavour import get_keras
    >>> keras = get_keras()
    >>> def build():
    ...     return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="a"),
    ...                              keras.layers.Dense(1, name="b")])
    >>> spec = describe_model(build)
    >>> spec.names, spec.params, spec.shapes
    (('a', 'b'), (16, 5), ((3,), (4,), (1,)))
    >>> stage = build_stage(spec, (0, 1, 2), stage=1)
    >>> [w.shape for w in stage.get_weights()]
    [(4, 1), (1,)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tfdist.compat import models as keras_compat
from tfdist.core.flavour import flavour_of, get_keras
from tfdist.errors import StrategyConfigError, format_error
from tfdist.pipeline import graph as graphs
from tfdist.pipeline import initial, partition, transport

__all__ = ["LayerSpec", "ModelSpec", "describe_model", "split_model", "build_stage", "assemble",
           "stage_weights", "stage_layers", "owned_layers", "layer_weights", "set_layer_weights",
           "rebuild_layer", "weights_nbytes"]


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """One layer of a model, without its weights.

    Attributes:
        name: Its name (unique in the flattened model).
        class_name: Its class's name.
        config: Its serialized config (``keras.layers.serialize``).
        params: Its parameter count.
        param_bytes: Bytes of its weights.
        weights: Its weights as ``(shape, dtype)``, in ``get_weights`` order.
        cls: Its live class, used to rebuild it (so an unregistered custom layer works in the
            process that described it).
        draws: How a one-process build draws its weights (`tfdist.pipeline.initial.record`;
            ``()`` when described from a built model).
    """

    name: str
    class_name: str
    config: dict[str, Any]
    params: int
    param_bytes: int
    weights: tuple[tuple[tuple[int, ...], str], ...]
    cls: type | None = dataclasses.field(default=None, compare=False, repr=False)
    draws: tuple[Any, ...] = dataclasses.field(default=(), compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A model's graph without its weights: layers, their calls (nodes) in a topological
    order, and every tensor's shape and dtype (`tfdist.pipeline.graph`).

    A partition's bounds index `nodes`: stage ``k`` makes calls ``bounds[k]:bounds[k+1]``
    and holds the layers they call (a layer called in several stages, a tied embedding, is held
    by each of them).

    Attributes:
        name: The model's name.
        flavour: ``"keras3"`` or ``"tf_keras"``.
        layers: Each distinct layer, in the order of first call.
        nodes: The layer calls.
        shapes: Each tensor's shape without the batch dimension (the model's inputs first, then
            each call's outputs).
        dtypes: Each tensor's dtype.
        inputs: The model's input tensors.
        outputs: The model's output tensors.
        input_names: The names of the model's inputs.
        sequential: Whether the model is a ``keras.Sequential`` (`assemble` then makes one).
    """

    name: str
    flavour: str
    layers: tuple[LayerSpec, ...]
    nodes: tuple[graphs.GraphNode, ...] = dataclasses.field(compare=False)
    shapes: tuple[tuple[int | None, ...], ...]
    dtypes: tuple[str, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    input_names: tuple[str, ...] = ()
    sequential: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        """The called layer's name, per node (split points name these)."""
        return tuple(self.layers[n.layer].name for n in self.nodes)

    @property
    def classes(self) -> tuple[str, ...]:
        """The called layer's class name, per node."""
        return tuple(self.layers[n.layer].class_name for n in self.nodes)

    @property
    def params(self) -> tuple[int, ...]:
        """The called layer's parameter count, per node."""
        return tuple(self.layers[n.layer].params for n in self.nodes)

    @property
    def param_bytes(self) -> tuple[int, ...]:
        """Bytes of each distinct layer's weights."""
        return tuple(layer.param_bytes for layer in self.layers)

    @property
    def weights(self) -> tuple[tuple[tuple[tuple[int, ...], str], ...], ...]:
        """Each distinct layer's weights as ``(shape, dtype)``."""
        return tuple(layer.weights for layer in self.layers)

    @property
    def total_param_bytes(self) -> int:
        return sum(self.param_bytes)

    def tensor_bytes(self) -> list[int]:
        """Bytes per row of each tensor (an unknown dimension counted as 1)."""
        return [int(np.prod([d or 1 for d in shape])) * np.dtype(dtype).itemsize
                if dtype != "string" else 0 for shape, dtype in zip(self.shapes, self.dtypes,
                                                                   strict=True)]

    def cuts(self, bounds: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """The tensors each cut carries (`tfdist.pipeline.partition.crossing`)."""
        return partition.crossing([n.inputs for n in self.nodes],
                                  [n.outputs for n in self.nodes], self.inputs, self.outputs,
                                  bounds)

    def boundary(self, tensors: Sequence[int]) -> tuple[transport.BoundaryTensor, ...]:
        """``tensors`` as a cut carries them: the model's inputs and non-float tensors without
        a gradient."""
        return tuple(transport.BoundaryTensor(
            self.shapes[t], self.dtypes[t],
            gradient=t not in self.inputs and _floating(self.dtypes[t])) for t in tensors)


def _floating(dtype: str) -> bool:
    return dtype in ("float16", "bfloat16", "float32", "float64")


def stage_layers(spec: ModelSpec, bounds: Sequence[int], stage: int) -> tuple[int, ...]:
    """The layers stage ``stage`` calls (indices into ``spec.layers``), in order of first call.

    Example:
        >>> keras = get_keras()
        >>> spec = describe_model(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
        >>> stage_layers(spec, (0, 1), 0)
        (0,)
    """
    nodes = spec.nodes[bounds[stage]:bounds[stage + 1]]
    return tuple(dict.fromkeys(n.layer for n in nodes))


def owned_layers(spec: ModelSpec, bounds: Sequence[int], stage: int) -> tuple[int, ...]:
    """The layers whose first call is in ``stage`` (each layer is owned by one stage)."""
    earlier = {lid for k in range(stage) for lid in stage_layers(spec, bounds, k)}
    return tuple(lid for lid in stage_layers(spec, bounds, stage) if lid not in earlier)


def _shape(tensor: Any) -> tuple[int | None, ...]:
    return tuple(None if d is None else int(d) for d in tuple(tensor.shape)[1:])


def _dtype(tensor: Any) -> str:
    dtype = tensor.dtype
    return getattr(dtype, "name", None) or str(dtype)


def weights_nbytes(weights: Sequence[Any]) -> int:
    """Bytes held by weights (variables or arrays, either Keras).

    Example:
        >>> import numpy as np
        >>> weights_nbytes([np.zeros((2, 3), "float32"), np.zeros(4, "float64")])
        56
    """
    return sum(int(np.prod(w.shape)) * np.dtype(_dtype(w)).itemsize for w in weights)


def _layer_spec(keras: Any, layer: Any) -> LayerSpec:
    # A keras.ops call in a Keras 3 functional graph (BERT's, Gemma's) is an Operation, not a
    # Layer: it serializes the same way and holds no weights.
    weights = getattr(layer, "weights", ())
    try:
        config = keras.saving.serialize_keras_object(layer) if _is_operation(keras, layer) \
            else keras.layers.serialize(layer)
    except (NotImplementedError, TypeError, ValueError, AttributeError, KeyError) as err:
        # (KerasHub 0.32's LlamaTransformerDecoder.get_config reads an attribute it never sets)
        raise _not_rebuildable(layer.name, type(layer).__name__, "(none: serializing failed)",
                               err) from err
    return LayerSpec(
        name=layer.name, class_name=type(layer).__name__,
        config=config, params=sum(int(np.prod(w.shape)) for w in weights),
        param_bytes=weights_nbytes(weights),
        weights=tuple((tuple(int(d) for d in w.shape), _dtype(w)) for w in weights),
        cls=type(layer), draws=initial.record(layer))


def _is_operation(keras: Any, layer: Any) -> bool:
    """Whether ``layer`` is a Keras 3 operation (a ``keras.ops`` call), not a layer."""
    return not isinstance(layer, keras.layers.Layer)


def describe_model(model_or_fn: Any | Callable[[], Any]) -> ModelSpec:
    """Describes a built Keras model, or the one ``model_or_fn()`` builds (without weights);
    a `ModelSpec` is returned as it is (a build function is called once: it may draw seeds).

    Raises:
        StrategyConfigError: it is not a Keras model built from ``keras.Input`` tensors.
    """
    if isinstance(model_or_fn, ModelSpec):
        return model_or_fn
    if callable(model_or_fn) and not hasattr(model_or_fn, "layers"):
        with keras_compat.abstract_build():
            return describe_model(model_or_fn())
    model = model_or_fn
    flavour = flavour_of(model)
    if flavour is None:
        raise StrategyConfigError(format_error(
            "The pipeline needs a Keras model.", received=type(model).__name__,
            expected="a keras.Sequential or functional keras.Model, or a function building one",
            fix="pass the model, or a function that builds it"))
    keras_compat.refuse_model_shape(model, "pipeline", single_output=True)
    keras = get_keras(flavour)
    graph = graphs.read_graph(model)
    _check_unique_names(graph.layers)
    return ModelSpec(
        name=model.name, flavour=flavour,
        layers=tuple(_layer_spec(keras, layer) for layer in graph.layers),
        nodes=graph.nodes, shapes=tuple(_shape(t) for t in graph.tensors),
        dtypes=tuple(_dtype(t) for t in graph.tensors), inputs=graph.inputs,
        outputs=graph.outputs,
        input_names=tuple(_input_name(t, i) for i, t in enumerate(model.inputs)),
        sequential=isinstance(model, keras.Sequential))


def _input_name(tensor: Any, i: int) -> str:
    layer = tensor._keras_history[0]
    return str(getattr(layer, "name", None) or f"input_{i}")


def _check_unique_names(layers: Sequence[Any]) -> None:
    seen: dict[str, int] = {}
    for layer in layers:
        seen[layer.name] = seen.get(layer.name, 0) + 1
    repeated = sorted(name for name, count in seen.items() if count > 1)
    if repeated:
        raise StrategyConfigError(format_error(
            "Layers of nested models share names: the flattened model needs distinct ones.",
            received=f"repeated names {repeated}", expected="distinct layer names",
            fix="leave name= out (Keras then numbers them), or name each block's layers apart"))


def split_model(
    model_or_fn: Any, stages: int, micro_batches: int = 1,
    split_points: Sequence[str] | None = None,
    layer_costs: Sequence[float] | None = None, batch_norm: str = "refuse",
) -> tuple[ModelSpec, tuple[int, ...]]:
    """Describes a model (without weights for a build function) and splits it into ``stages``.

    ``split_points`` name the first layer of each stage; else the stages are balanced by
    ``layer_costs`` (measured seconds per layer call, e.g. from `tfdist.advise`), else by
    parameter count; among equally balanced splits, the one whose cuts carry the fewest bytes.

    Raises:
        StrategyConfigError: too many stages, bad split points, a layer that cannot be
            rebuilt from its config, or a layer the
            pipeline cannot train exactly with ``micro_batches`` (BatchNormalization, a loss
            added in ``call``).

    Example:
        >>> keras = get_keras()
        >>> def build():
        ...     return keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, name="a"),
        ...                              keras.layers.Dense(8, name="b"),
        ...                              keras.layers.Dense(1, name="c")])
        >>> split_model(build, stages=2)[1]
        (0, 1, 3)
        >>> split_model(build, stages=2, split_points=["c"])[1]
        (0, 2, 3)
        >>> split_model(build, stages=2, layer_costs=[1.0, 1.0, 3.0])[1]
        (0, 2, 3)
    """
    spec = describe_model(model_or_fn)
    partition.check_stages(stages, len(spec.nodes))
    if split_points is not None:
        bounds = partition.bounds_from_split_points(spec.names, split_points, stages)
    else:
        costs = ([max(p, 1) for p in spec.params] if layer_costs is None
                 else partition.check_layer_costs(layer_costs, spec.names))
        carried = partition.cut_bytes(
            [n.inputs for n in spec.nodes], [n.outputs for n in spec.nodes], spec.inputs,
            spec.outputs, spec.tensor_bytes())
        bounds = partition.balanced_bounds(costs, stages, carried)
    _check_rebuildable(spec)
    if batch_norm == "refuse":  # else the explicit opt-in (`PipelineConfig.batch_norm`)
        partition.check_layer_classes(spec.classes, spec.names, micro_batches)
    if micro_batches > 1:
        partition.check_added_losses([added_loss(spec, i) for i in range(len(spec.nodes))],
                                     spec.names, micro_batches)
    return spec, bounds


def _check_rebuildable(spec: ModelSpec) -> None:
    """Rebuilds every layer that is not one of Keras's from its config (no weights): refuses
    up front what a stage could not rebuild."""
    keras = get_keras(spec.flavour)  # type: ignore[arg-type]
    with keras_compat.abstract_build(spec.flavour):  # type: ignore[arg-type]
        for layer in spec.layers:
            if not _from_keras(layer.config):
                rebuild_layer(keras, layer)


ROW_ADDITIVE_REGULARIZERS = ("L1", "L2", "L1L2")
"""Keras's activity regularizers that are sums over the rows: divided by the rows (as both
Kerases do), micro-batches' terms divided by M add up to the whole batch's."""


def _from_keras(config: dict[str, Any]) -> bool:
    return str(config.get("module") or "").startswith("keras")


def rebuild_layer(keras: Any, layer: LayerSpec) -> Any:
    """A new layer like ``layer``, from its config (its live class for the class's name).

    Raises:
        StrategyConfigError: the config does not rebuild the layer (a custom layer whose
            ``get_config`` misses constructor arguments, or that holds unregistered objects).
    """
    config = layer.config
    objects = {config.get("class_name"): layer.cls}
    if config.get("registered_name"):
        objects[config["registered_name"]] = layer.cls
    custom_objects = {k: v for k, v in objects.items() if k and v is not None}
    try:
        if layer.cls is not None and not issubclass(layer.cls, keras.layers.Layer):
            return keras.saving.deserialize_keras_object(config, custom_objects=custom_objects)
        return keras.layers.deserialize(config, custom_objects=custom_objects)
    except (TypeError, ValueError, KeyError) as err:
        raise _not_rebuildable(layer.name, layer.class_name, config.get("config"),
                               err) from err


def _not_rebuildable(name: str, class_name: str, config: Any,
                     err: Exception) -> StrategyConfigError:
    return StrategyConfigError(format_error(
        f"Layer {name!r} ({class_name}) cannot be rebuilt from its config, which each "
        f"pipeline stage does: {str(err).strip()[:300]}",
        received=f"{class_name}.get_config() = {config}",
        expected="a config from which the class rebuilds the layer",
        fix=f"give {class_name} a get_config() returning its constructor arguments (plain "
        "values, or objects decorated with @keras.saving.register_keras_serializable()), and "
        "decorate the class with @keras.saving.register_keras_serializable()"))


def added_loss(spec: ModelSpec, i: int) -> str | None:
    """What the layer of node ``i`` adds to the loss in each call that micro-batches cannot
    reproduce exactly: an activity regularizer other than `ROW_ADDITIVE_REGULARIZERS`, or
    ``add_loss`` in the ``call`` of a layer that is not one of Keras's (found by calling a copy
    of it once on zeros). None if nothing.

    Example:
        >>> keras = get_keras()
        >>> spec = describe_model(keras.Sequential([keras.Input((2,)), keras.layers.Dense(
        ...     1, activity_regularizer=keras.regularizers.L2(0.1))]))
        >>> added_loss(spec, 0) is None
        True
    """
    node = spec.nodes[i]
    layer_spec = spec.layers[node.layer]
    config = layer_spec.config
    activity = config.get("config", {}).get("activity_regularizer")
    if activity is not None and not (
            _from_keras(activity) and activity.get("class_name") in ROW_ADDITIVE_REGULARIZERS):
        return f"activity_regularizer {activity.get('class_name')}"
    keras = get_keras(spec.flavour)  # type: ignore[arg-type]
    if str(config.get("module") or "").startswith(("keras.layers", "keras.src.ops")) or (
            layer_spec.cls is not None and not issubclass(layer_spec.cls, keras.layers.Layer)):
        return None
    layer = rebuild_layer(keras, layer_spec)
    values = {t: np.zeros((2, *[d or 1 for d in spec.shapes[t]]), spec.dtypes[t])
              for t in node.inputs}
    graphs.replay([node], {node.layer: layer}, values)
    if len(keras_compat.call_losses(layer)) > (activity is not None):
        return "add_loss() in call()"
    return None


def build_stage(spec: ModelSpec, bounds: Sequence[int], stage: int, cls: type | None = None,
                layer_maker: Callable[[Any, LayerSpec], Any] | None = None,
                **kwargs: Any) -> Any:
    """Builds the calls ``bounds[stage]:bounds[stage+1]`` of ``spec`` as a functional model (of
    class ``cls``, a functional model class, if given).

    Its inputs are the tensors the cut before it carries (a list; stage 0: the model's
    inputs), its outputs those the cut after it carries (a list; the last stage: the model's
    outputs, one tensor if it has one). Only this stage's variables are created. Each layer is
    ``layer_maker(keras, layer_spec)`` (default `rebuild_layer`; a tensor-split stage makes its
    shard, `tfdist.tensor.stages.StageSplit.layer_maker`).
    """
    keras = get_keras(spec.flavour)  # type: ignore[arg-type]
    start, stop = bounds[stage], bounds[stage + 1]
    last = stage == len(bounds) - 2
    cuts = spec.cuts(bounds)
    ins = spec.inputs if stage == 0 else cuts[stage - 1]
    outs = spec.outputs if last else cuts[stage]
    make = layer_maker or rebuild_layer
    layers = {lid: make(keras, spec.layers[lid]) for lid in stage_layers(spec, bounds, stage)}
    values = {t: keras.Input(spec.shapes[t], dtype=spec.dtypes[t],
                             name=_boundary_name(spec, t, stage)) for t in ins}
    graphs.replay(spec.nodes[start:stop], layers, values)
    outputs: Any = [values[t] for t in outs]
    if last and len(outputs) == 1:
        outputs = outputs[0]
    kwargs.setdefault("name", f"{spec.name}_stage{stage}")
    model_cls = cls or keras_compat.functional_class(spec.flavour)  # type: ignore[arg-type]
    return model_cls(inputs=[values[t] for t in ins], outputs=outputs, **kwargs)


def _boundary_name(spec: ModelSpec, tensor: int, stage: int) -> str:
    if tensor in spec.inputs and stage == 0:
        return spec.input_names[spec.inputs.index(tensor)]
    return f"{spec.name}_cut{stage}_tensor{tensor}"


def layer_weights(model: Any, spec: ModelSpec, layer_ids: Sequence[int]) -> list[Any]:
    """The weights of layers ``layer_ids`` of ``spec``, read from ``model`` (a stage, or the
    assembled model) by layer name."""
    return [w for lid in layer_ids if spec.layers[lid].weights
            for w in model.get_layer(spec.layers[lid].name).get_weights()]


def set_layer_weights(model: Any, spec: ModelSpec, layer_ids: Sequence[int],
                      weights: Sequence[Any]) -> None:
    """Sets the weights of layers ``layer_ids`` of ``model`` from ``weights`` (in the order
    `layer_weights` gives)."""
    weights = list(weights)
    for lid in layer_ids:
        count = len(spec.layers[lid].weights)
        if count:  # an operation (keras.ops) holds none and is not in model.layers
            model.get_layer(spec.layers[lid].name).set_weights(weights[:count])
        weights = weights[count:]


def assemble(spec: ModelSpec, weights: Sequence[Any] | None = None) -> Any:
    """The whole model (a Sequential if it was one, else a functional model; same layer
    names), with ``weights`` (every layer's, in ``spec.layers`` order) if given."""
    keras = get_keras(spec.flavour)  # type: ignore[arg-type]
    if spec.sequential:
        (tensor,) = spec.inputs
        model = keras.Sequential(
            [keras.Input(spec.shapes[tensor], dtype=spec.dtypes[tensor]),
             *[rebuild_layer(keras, layer) for layer in spec.layers]], name=spec.name)
    else:
        whole = build_stage(spec, (0, len(spec.nodes)), 0, name=spec.name)
        inputs = whole.inputs[0] if len(whole.inputs) == 1 else whole.inputs
        model = keras.Model(inputs=inputs, outputs=whole.outputs[0] if len(whole.outputs) == 1
                            else whole.outputs, name=spec.name)
    if weights is not None:
        set_layer_weights(model, spec, range(len(spec.layers)), weights)
    return model


def stage_weights(model: Any, spec: ModelSpec, bounds: Sequence[int], stage: int) -> list[Any]:
    """The weights of the layers ``stage`` holds (`stage_layers`), taken from a built whole
    ``model`` (nested models included)."""
    layers = graphs.read_graph(model).layers
    return [w for lid in stage_layers(spec, bounds, stage) if spec.layers[lid].weights
            for w in layers[lid].get_weights()]
