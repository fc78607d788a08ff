"""A model created under a Keras ``ModelParallel`` made this process's shard, in place.

Keras users create the model under the distribution and then call ``compile`` and ``fit`` on
that very object. So the model is not rebuilt: at its first ``fit``, ``evaluate`` or
``predict`` (then compiled again with its last ``compile``'s arguments) it is
planned by the LayoutMap (`tfdist.kdist.layout`), its weights made rank 0's everywhere, each
block holding split layers checked whole against split (`tfdist.tensor.blocks.checked_plan`),
its layers sharded in place (`tfdist.tensor.inplace`), and its class becomes a subclass of its
own and of `tfdist.tensor.model.TensorModel`: the tensor engine's steps (the data replica's
rows, the data axis's gradient average, clipping over the whole split variables) with the
model's own layers, config and methods. ``model.save`` gathers the whole model and the chief
writes it (`TensorStrategy.save_model`).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from tfdist.errors import StrategyConfigError, format_error

__all__ = ["install", "shard_in_place", "sharded_class"]

_log = logging.getLogger("tfdist")
_ATTRIBUTE = "_tfdist_keras_distribution"
_classes: dict[type, type] = {}


def sharded_class(cls: type) -> type:
    """``cls`` with the tensor engine's steps (one class per ``cls``)."""
    from tfdist.tensor.model import TensorModel

    if issubclass(cls, TensorModel):
        return cls
    if cls not in _classes:
        def save(self: Any, filepath: Any, *args: Any, **kwargs: Any) -> Any:
            """Every process calls it; the chief writes the whole model."""
            del args
            return self._tfdist_strategy.save_model(self, filepath, **kwargs)

        _classes[cls] = type(cls.__name__, (TensorModel, cls), {
            "save": save, "__module__": cls.__module__,
            "__doc__": f"{cls.__name__}, one tensor-parallel shard (tfdist)."})
    return _classes[cls]


def _refuse_demoted(before: Any, after: Any) -> None:
    """A block the LayoutMap asks to split, kept whole by the check: refused."""
    for old, new in zip(before.layers, after.layers, strict=True):
        if old.split and not new.split:
            raise StrategyConfigError(format_error(
                f"The LayoutMap splits {old.name!r}, but its block computes something else "
                "split than whole, so tfdist will not train it split.",
                received=f"{old.name}: {new.reason}",
                expected="a block whose split outputs and gradients equal its whole ones",
                fix=f"leave {old.name!r}'s variables out of the LayoutMap (kept whole)"))


def shard_in_place(model: Any, distribution: Any, strategy: Any, mesh: Any) -> None:
    """Makes ``model`` this process's shard of ``distribution``'s LayoutMap (see the module).

    Args:
        model: A built model created under ``distribution``.
        distribution: The ``keras.distribution.ModelParallel``.
        strategy: The process's `TensorStrategy` (None: a job of one process: checked only).
        mesh: The job's `tfdist.parallel.mesh.Mesh`.
    """
    from tfdist.kdist.layout import plan_from_layout
    from tfdist.kdist.mesh import model_axis_of

    data_axis = distribution.batch_dim_name
    model_axis = model_axis_of(distribution.device_mesh.axis_names, data_axis)
    if not model.built:
        raise StrategyConfigError(format_error(
            "A model under ModelParallel must be built before compile: tfdist splits its "
            "variables by the LayoutMap.", received=f"an unbuilt {type(model).__name__}",
            expected="a functional model, or one called once on an input",
            fix="build it (model.build(shape) or call it once) before compile"))
    layout = plan_from_layout(model, distribution._layout_map, model_axis, data_axis,
                              mesh.tensor, mesh.data)
    model._tfdist_layout_plan = layout
    if strategy is None:
        return
    _shard(model, layout, strategy)


def _shard(model: Any, layout: Any, strategy: Any) -> None:
    from tfdist.parallel.keys import next_key
    from tfdist.parallel.ops import broadcast_variable
    from tfdist.tensor import blocks
    from tfdist.tensor import build as shards_of
    from tfdist.tensor.inplace import shard_in_place as shard_layers
    from tfdist.tensor.plan import check_coverage

    # outside the strategy's scope, as `TensorStrategy.build_model` makes a model of blocks:
    # the shard's replicated variables and the optimizer's slots stay plain variables
    for group in (strategy.tensor_group, strategy.data_group):
        if group.size > 1:
            for variable in model.weights:
                broadcast_variable(variable, group=group, instance=next_key(group.key),
                                   timeout=strategy.timeout)
    plan, units, _ = blocks.checked_plan(model, layout.plan, layout.units, strategy._agree)
    _refuse_demoted(layout.plan, plan)
    check_coverage(plan, repr(model.name))
    source = blocks.WholeSource(model)
    tensor = strategy.tensor_group
    shard_layers(model, plan, units, tensor, strategy.timeout)
    model.__class__ = sharded_class(type(model))
    model.attach(plan, tensor, strategy.data_group, shards_of.vocab_start(plan, tensor),
                 strategy.timeout, first_timeout=strategy.first_step_timeout)
    strategy._agree_seeds(model)  # an unseeded Dropout draws alike on every shard
    model._tfdist_strategy = strategy
    strategy.plan, strategy._abstract = plan, source
    if strategy.is_chief:
        _log.log(logging.WARNING if layout.notes else logging.INFO,
                 "keras.distribution.ModelParallel on tfdist: %s\n%s%s", strategy.describe(),
                 plan.table(), "".join(f"\n  note: {n}" for n in layout.notes))


def _converted(model: Any) -> bool:
    return hasattr(model, "_tfdist_layout_plan")


def _convert(model: Any) -> None:
    from tfdist.kdist.backend import active_strategy, mesh_of

    distribution = getattr(model, _ATTRIBUTE, None)
    if distribution is None or _converted(model):
        return
    strategy = active_strategy(distribution)
    shard_in_place(model, distribution, strategy, mesh_of(distribution)[1])


def _wrap_init(original: Any) -> Any:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        from keras.distribution import ModelParallel, distribution

        current = distribution()
        if isinstance(current, ModelParallel) and not hasattr(self, _ATTRIBUTE):
            object.__setattr__(self, _ATTRIBUTE, current)
        original(self, *args, **kwargs)

    __init__.__tfdist_kdist__ = True  # type: ignore[attr-defined]
    return __init__


def _wrap_compile(original: Any) -> Any:
    @functools.wraps(original)
    def compile(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, _ATTRIBUTE, None) is not None and not _converted(self):
            # A KerasHub task compiles itself in __init__: the model is sharded at its first
            # fit/evaluate/predict, and compiled again then with the last arguments given.
            object.__setattr__(self, "_tfdist_compile_args", (args, kwargs))
        return original(self, *args, **kwargs)

    compile.__tfdist_kdist__ = True  # type: ignore[attr-defined]
    return compile


def _unbuilt(value: Any) -> Any:
    """An optimizer built for the whole model's variables (Keras, or tfdist's shim, builds it
    before the first fit) as a new one of the same config, for the shard's variables."""
    import keras

    if isinstance(value, keras.optimizers.Optimizer) and value.built:
        return type(value).from_config(value.get_config())
    return value


def _wrap_call(original: Any) -> Any:
    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, _ATTRIBUTE, None) is not None and not _converted(self):
            _convert(self)
            if hasattr(self, "tensor_plan") and hasattr(self, "_tfdist_compile_args"):
                compile_args, compile_kwargs = self._tfdist_compile_args
                self.compile(*[_unbuilt(a) for a in compile_args],
                             **{k: _unbuilt(v) for k, v in compile_kwargs.items()})
            return getattr(self, original.__name__)(*args, **kwargs)  # the shard's own
        return original(self, *args, **kwargs)

    method.__tfdist_kdist__ = True  # type: ignore[attr-defined]
    return method


def install() -> None:
    """Records the ModelParallel a model is created under and its compile arguments; shards it
    at its first fit, evaluate or predict (the Keras 3 trainer's methods, on the class that
    defines each)."""
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    for name in ("__init__", "compile", "predict", "fit", "evaluate"):
        owner = next(k for k in TensorFlowTrainer.__mro__ if name in vars(k))
        current = vars(owner)[name]
        if getattr(current, "__tfdist_kdist__", False):
            continue
        wrap = {"__init__": _wrap_init, "compile": _wrap_compile}.get(name)
        setattr(owner, name, wrap(current) if wrap else _wrap_call(current))
