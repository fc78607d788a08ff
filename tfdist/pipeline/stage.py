"""A model described without its weights, and one stage of it built for real.

`describe_model` reads a Keras model (built, or built by a function inside `keras_compat`'s
`abstract_build`, which allocates no weights) into a `ModelSpec`: each layer's config, output
shape and parameter count, and which layer feeds which. `build_stage` then builds
``keras.Sequential([Input(boundary shape), *layers[a:b]])`` from the configs, so a stage process
creates only its own stage's variables. `assemble` rebuilds the whole model from the spec (for
saving) and `stage_weights` slices a full model's weights per stage.

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

from tfdist.core.flavour import flavour_of, get_keras
from tfdist.errors import StrategyConfigError, format_error
from tfdist.pipeline import keras_compat, partition

__all__ = ["ModelSpec", "describe_model", "split_model", "build_stage", "assemble",
           "stage_weights", "weights_nbytes"]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A chain model's layers, without weights.

    Attributes:
        name: The model's name.
        flavour: ``"keras3"`` or ``"tf_keras"``.
        configs: Each layer's serialized config (``keras.layers.serialize``), input excluded.
        names: Layer names.
        classes: Layer class names.
        shapes: ``shapes[0]`` the model input's shape, ``shapes[i+1]`` layer ``i``'s output
            shape, all without the batch dimension.
        dtypes: The dtype of the model input, then of each layer's output.
        params: Parameters per layer.
        param_bytes: Bytes of each layer's weights.
        weights: Each layer's weights as ``(shape, dtype)``, in ``get_weights`` order.
        edges: ``(producer, consumer)`` layer indices (-1: the model input).
    """

    name: str
    flavour: str
    configs: tuple[dict[str, Any], ...]
    names: tuple[str, ...]
    classes: tuple[str, ...]
    shapes: tuple[tuple[int | None, ...], ...]
    dtypes: tuple[str, ...]
    params: tuple[int, ...]
    param_bytes: tuple[int, ...]
    weights: tuple[tuple[tuple[tuple[int, ...], str], ...], ...]
    edges: tuple[tuple[int, int], ...]

    @property
    def total_param_bytes(self) -> int:
        return sum(self.param_bytes)


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


def _producers(layer: Any, index: dict[int, int]) -> list[int]:
    inputs = layer.input if isinstance(layer.input, (list, tuple)) else [layer.input]
    return [index.get(id(t._keras_history[0]), -1) for t in inputs]


def describe_model(model_or_fn: Any | Callable[[], Any]) -> ModelSpec:
    """Describes a built Keras model, or the one ``model_or_fn()`` builds (without weights).

    Raises:
        StrategyConfigError: it is not a Keras model with one input and one output.
    """
    if callable(model_or_fn) and not hasattr(model_or_fn, "layers"):
        with keras_compat.abstract_build():
            return describe_model(model_or_fn())
    model = model_or_fn
    flavour = flavour_of(model)
    inputs, outputs = getattr(model, "inputs", None), getattr(model, "outputs", None)
    if flavour is None or not inputs or len(inputs) != 1 or len(outputs) != 1:
        raise StrategyConfigError(format_error(
            "The pipeline needs a built Keras model with one input and one output.",
            received=type(model).__name__, expected="a keras.Sequential starting with "
            "keras.Input(...), or a functional keras.Model of a chain of layers",
            fix="add keras.Input(shape) as the first layer"))
    keras = get_keras(flavour)
    layers = [layer for layer in model.layers if type(layer).__name__ != "InputLayer"]
    index = {id(layer): i for i, layer in enumerate(layers)}
    edges = tuple((p, i) for i, layer in enumerate(layers) for p in _producers(layer, index))
    return ModelSpec(
        name=model.name, flavour=flavour,
        configs=tuple(keras.layers.serialize(layer) for layer in layers),
        names=tuple(layer.name for layer in layers),
        classes=tuple(type(layer).__name__ for layer in layers),
        shapes=(_shape(inputs[0]), *(_shape(layer.output) for layer in layers)),
        dtypes=(_dtype(inputs[0]), *(_dtype(layer.output) for layer in layers)),
        params=tuple(int(layer.count_params()) for layer in layers),
        param_bytes=tuple(weights_nbytes(layer.weights) for layer in layers),
        weights=tuple(tuple((tuple(int(d) for d in w.shape), _dtype(w)) for w in layer.weights)
                      for layer in layers),
        edges=edges,
    )


def split_model(
    model_or_fn: Any, stages: int, micro_batches: int = 1,
    split_points: Sequence[str] | None = None,
    layer_costs: Sequence[float] | None = None, batch_norm: str = "refuse",
) -> tuple[ModelSpec, tuple[int, ...]]:
    """Describes a model (without weights for a build function) and splits it into ``stages``.

    ``split_points`` name the first layer of each stage; else the stages are balanced by
    ``layer_costs`` (measured seconds per layer, e.g. from `tfdist.advise`), else by parameter
    count.

    Raises:
        StrategyConfigError: too many stages, bad split points, a layer whose output is used
            beyond the next layer (skip connections), or a layer the pipeline cannot train
            exactly with ``micro_batches`` (BatchNormalization, a loss added in ``call``).

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
    partition.check_stages(stages, len(spec.names))
    for shape in spec.shapes:
        if any(d is None for d in shape):
            raise StrategyConfigError(format_error(
                "The pipeline needs static shapes between layers.",
                received=f"shapes {list(spec.shapes)}", expected="no None beyond the batch axis",
                fix="give keras.Input a full shape (e.g. a fixed sequence length)"))
    if split_points is not None:
        bounds = partition.bounds_from_split_points(spec.names, split_points, stages)
    elif layer_costs is not None:
        bounds = partition.balanced_bounds(
            partition.check_layer_costs(layer_costs, spec.names), stages)
    else:
        bounds = partition.balanced_bounds([max(p, 1) for p in spec.params], stages)
    partition.check_edges(spec.edges, bounds, spec.names)
    if batch_norm == "refuse":  # else the explicit opt-in (`PipelineConfig.batch_norm`)
        partition.check_layer_classes(spec.classes, spec.names, micro_batches)
    if micro_batches > 1:
        partition.check_added_losses([added_loss(spec, i) for i in range(len(spec.names))],
                                     spec.names, micro_batches)
    return spec, bounds


ROW_ADDITIVE_REGULARIZERS = ("L1", "L2", "L1L2")
"""Keras's activity regularizers that are sums over the rows: divided by the rows (as both
Kerases do), micro-batches' terms divided by M add up to the whole batch's."""


def _from_keras(config: dict[str, Any]) -> bool:
    return str(config.get("module") or "").startswith("keras")


def added_loss(spec: ModelSpec, i: int) -> str | None:
    """What layer ``i`` adds to the loss in each call that micro-batches cannot reproduce
    exactly: an activity regularizer other than `ROW_ADDITIVE_REGULARIZERS`, or ``add_loss``
    in the ``call`` of a layer that is not one of Keras's (found by calling a copy of it once on
    zeros). None if nothing.

    Example:
        >>> keras = get_keras()
        >>> spec = describe_model(keras.Sequential([keras.Input((2,)), keras.layers.Dense(
        ...     1, activity_regularizer=keras.regularizers.L2(0.1))]))
        >>> added_loss(spec, 0) is None
        True
    """
    config = spec.configs[i]
    activity = config.get("config", {}).get("activity_regularizer")
    if activity is not None and not (
            _from_keras(activity) and activity.get("class_name") in ROW_ADDITIVE_REGULARIZERS):
        return f"activity_regularizer {activity.get('class_name')}"
    if str(config.get("module") or "").startswith("keras.layers"):
        return None
    keras = get_keras(spec.flavour)  # type: ignore[arg-type]
    layer = keras.layers.deserialize(config)
    layer(np.zeros((2, *spec.shapes[i]), spec.dtypes[i]))
    if len(keras_compat.call_losses(layer)) > (activity is not None):
        return "add_loss() in call()"
    return None


def build_stage(spec: ModelSpec, bounds: Sequence[int], stage: int, cls: type | None = None,
                **kwargs: Any) -> Any:
    """Builds layers ``bounds[stage]:bounds[stage+1]`` of ``spec`` as a Sequential (or ``cls``).

    Only this stage's variables are created.
    """
    keras = get_keras(spec.flavour)  # type: ignore[arg-type]
    start, stop = bounds[stage], bounds[stage + 1]
    layers = [keras.layers.deserialize(config) for config in spec.configs[start:stop]]
    model_cls = cls or keras.Sequential
    inputs = keras.Input(spec.shapes[start], dtype=spec.dtypes[start])
    kwargs.setdefault("name", f"{spec.name}_stage{stage}")
    return model_cls([inputs, *layers], **kwargs)


def assemble(spec: ModelSpec, weights: Sequence[Any] | None = None) -> Any:
    """The whole model as one Sequential (same layer names), with ``weights`` if given."""
    model = build_stage(spec, (0, len(spec.names)), 0, name=spec.name)
    if weights is not None:
        model.set_weights(list(weights))
    return model


def stage_weights(model: Any, spec: ModelSpec, bounds: Sequence[int], stage: int) -> list[Any]:
    """The weights of ``stage``'s layers, taken from a built whole ``model`` by layer name."""
    names = spec.names[bounds[stage]:bounds[stage + 1]]
    return [w for name in names for w in model.get_layer(name).get_weights()]
