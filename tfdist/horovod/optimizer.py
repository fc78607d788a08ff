"""`DistributedOptimizer`: a Keras optimizer (either flavour) whose gradients are Horovod-averaged.

For training without a strategy, Horovod style: every process runs the script on its own shard
of the data, and the optimizer averages the gradients over all processes before each update, so
every rank applies the same update. Start from equal weights (`BroadcastVariablesCallback`).

One implementation (`GradientAllreducer`: one grouped, fused Horovod all-reduce of all gradients),
bound thinly per flavour:

* Keras 3 calls ``optimizer.apply(grads, variables)`` (``apply_gradients`` goes through it), so
  the binding overrides ``apply``. Horovod's own ``horovod.tensorflow.keras.DistributedOptimizer``
  hooks methods Keras 3 never calls, and silently does not synchronise.
* tf-keras (and its legacy optimizers) funnel ``minimize`` into ``apply_gradients``, which the
  binding overrides.

The gradients are reduced before clipping, loss-scale checks and the update, so those act on the
global gradient, as they would in one process on the whole global batch. Inside a
`tfdist.strategies.horovod.HorovodStrategy` scope the strategy already reduces the gradients and
the wrapper steps aside (no second all-reduce).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from tfdist import compat
from tfdist.errors import KerasCompatibilityError, format_error
from tfdist.horovod import ops

__all__ = ["DistributedOptimizer", "GradientAllreducer", "inside_horovod_strategy"]

_CLASSES: dict[type, type] = {}


def inside_horovod_strategy() -> bool:
    """Whether the current ``tf.distribute`` strategy already all-reduces with Horovod.

    Example:
        >>> inside_horovod_strategy()  # outside any strategy scope
        False
    """
    return bool(getattr(tf.distribute.get_strategy().extended, "_tfdist_horovod", False))


@dataclass(frozen=True)
class GradientAllreducer:
    """Reduces a list of gradients (None entries kept) over all Horovod ranks.

    Attributes:
        op: ``"average"`` (default: the mean gradient, as one process would compute on the whole
            global batch of a mean loss) or ``"sum"``.
        compression: None or ``"fp16"``.
        sparse_as_dense: Densify ``tf.IndexedSlices`` (embedding gradients) before reducing.

    Example:
        >>> reducer = GradientAllreducer(op="sum")
        >>> [float(g) for g in reducer([tf.constant(1.5)])]  # one process
        [1.5]
    """

    op: str = "average"
    compression: str | None = None
    sparse_as_dense: bool = False

    def __post_init__(self) -> None:
        ops.check_op(self.op)
        ops.check_compression(self.compression)

    def __call__(self, grads: Sequence[Any]) -> list[Any]:
        if inside_horovod_strategy():
            return list(grads)
        return ops.allreduce(grads, op=self.op, compression=self.compression,
                             sparse_as_dense=self.sparse_as_dense)


def _keras3_methods(base: type) -> dict[str, Callable[..., Any]]:
    def apply(self: Any, grads: Sequence[Any], trainable_variables: Any = None) -> Any:
        return base.apply(self, self._tfdist_allreduce(list(grads)), trainable_variables)

    return {"apply": apply}


def _tf_keras_methods(base: type) -> dict[str, Callable[..., Any]]:
    def apply_gradients(self: Any, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)
        grads = self._tfdist_allreduce([g for g, _ in pairs])
        reduced = list(zip(grads, [v for _, v in pairs], strict=True))
        return base.apply_gradients(self, reduced, *args, **kwargs)

    return {"apply_gradients": apply_gradients}


_BINDINGS = {"keras3": _keras3_methods, "tf_keras": _tf_keras_methods}


def _distributed_class(base: type, flavour: compat.KerasFlavour) -> type:
    """A subclass of ``base`` with the same name and module (saved models load without tfdist)."""
    if base not in _CLASSES:
        namespace = {**_BINDINGS[flavour](base), "__module__": base.__module__,
                     "__qualname__": base.__qualname__, "_tfdist_distributed": True}
        _CLASSES[base] = type(base.__name__, (base,), namespace)
    return _CLASSES[base]


def DistributedOptimizer(  # noqa: N802 - named like the class it returns, as in Horovod
    optimizer: Any,
    *,
    op: str = "average",
    compression: str | None = None,
    sparse_as_dense: bool = False,
) -> Any:
    """Returns a copy of ``optimizer`` that all-reduces gradients with Horovod before updating.

    Works for Keras 3 and tf-keras optimizers (the flavour is read from the optimizer's class).
    The copy is made with ``from_config``, so create it before training starts.

    Args:
        optimizer: A Keras 3 or tf-keras optimizer (incl. legacy and loss-scale optimizers).
        op: ``"average"`` (default) or ``"sum"``.
        compression: None, or ``"fp16"`` to send float gradients as float16.
        sparse_as_dense: All-reduce embedding gradients densely instead of all-gathering them.

    Tensor fusion: all gradients go to Horovod in one grouped call, and Horovod packs them into
    buffers of up to ``HOROVOD_FUSION_THRESHOLD`` bytes; set it (or ``fusion_threshold_bytes`` in
    `tfdist.horovod.init`) before Horovod initialises.

    Raises:
        KerasCompatibilityError: ``optimizer`` is not a Keras optimizer.
        StrategyConfigError: ``op`` or ``compression`` is not one of the accepted names.

    Example:
        >>> import keras
        >>> opt = DistributedOptimizer(keras.optimizers.SGD(0.1), compression="fp16")
        >>> type(opt).__name__, round(float(opt.learning_rate), 6)
        ('SGD', 0.1)
    """
    flavour = compat.flavour_of(optimizer)
    if flavour is None or not hasattr(optimizer, "get_config"):
        raise KerasCompatibilityError(
            format_error(
                "DistributedOptimizer wraps Keras optimizers only.",
                received=type(optimizer).__module__ + "." + type(optimizer).__name__,
                expected="a keras.optimizers or tf_keras.optimizers optimizer",
                fix="pass e.g. keras.optimizers.SGD(0.01); for tf.compat.v1 optimizers use "
                "horovod.tensorflow.DistributedOptimizer",
            )
        )
    reducer = GradientAllreducer(op=op, compression=compression, sparse_as_dense=sparse_as_dense)
    base = type(optimizer)
    if getattr(base, "_tfdist_distributed", False):
        base = base.__bases__[0]
    wrapped = _distributed_class(base, flavour).from_config(optimizer.get_config())
    wrapped._tfdist_allreduce = reducer
    return wrapped
