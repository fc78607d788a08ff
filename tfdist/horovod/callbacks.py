"""Keras callbacks for Horovod training, one implementation bound to each Keras flavour.

The logic lives in `_BroadcastLogic` and `_MetricAverageLogic`; each public class, when
instantiated, returns an instance of a subclass that also inherits the ``Callback`` base of the
requested flavour (Keras 3 or tf-keras), so ``isinstance(cb, BroadcastVariablesCallback)`` holds
and either ``fit`` accepts it. The flavour defaults to `tfdist.compat.keras_flavour` (tf-keras
when ``TF_USE_LEGACY_KERAS=1``).

Example:
    ::

        model.fit(x, y, callbacks=[BroadcastVariablesCallback(), MetricAverageCallback()])
"""

from __future__ import annotations

from typing import Any

from tfdist import compat
from tfdist.horovod import ops

__all__ = ["BroadcastVariablesCallback", "MetricAverageCallback"]

_BOUND: dict[tuple[type, str], type] = {}


class _FlavouredCallback:
    """Instantiating a subclass yields an instance bound to one flavour's ``Callback`` base."""

    def __new__(cls, *args: Any, flavour: compat.KerasFlavour | None = None, **kwargs: Any) -> Any:
        flavour = flavour or compat.keras_flavour()
        key = (cls, flavour)
        if key not in _BOUND:
            base = compat.get_keras(flavour).callbacks.Callback
            _BOUND[key] = type(cls.__name__, (cls, base), {"__module__": cls.__module__,
                                                           "__qualname__": cls.__qualname__})
        return object.__new__(_BOUND[key])


class _BroadcastLogic:
    def _init_broadcast(self, root_rank: int) -> None:
        self.root_rank = root_rank
        self.broadcast_count = 0
        self._optimizer_count = 0
        self._check_first_batch = False

    def _optimizer_vars(self) -> list[Any]:
        optimizer = getattr(self.model, "optimizer", None)  # type: ignore[attr-defined]
        return [] if optimizer is None else compat.optimizer_variables(optimizer)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        optimizer_vars = self._optimizer_vars()
        model_vars = list(self.model.variables)  # type: ignore[attr-defined]
        self.broadcast_count = ops.broadcast_variables(model_vars + optimizer_vars, self.root_rank)
        self._optimizer_count = len(optimizer_vars)
        self._check_first_batch = True

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # tf-keras creates optimizer slots in the first step: send them once they exist (they
        # may hold state restored on the root rank only).
        if not self._check_first_batch:
            return
        self._check_first_batch = False
        optimizer_vars = self._optimizer_vars()
        if len(optimizer_vars) != self._optimizer_count:
            self.broadcast_count += ops.broadcast_variables(optimizer_vars, self.root_rank)


class BroadcastVariablesCallback(_BroadcastLogic, _FlavouredCallback):
    """Copies rank ``root_rank``'s model and optimizer variables to every rank when ``fit`` starts.

    Optimizer variables created during the first step (tf-keras builds them lazily) are sent
    again after that step. Every rank must have the same model (same variables, same order).

    Args:
        root_rank: The rank whose values win.
        flavour: ``"keras3"`` or ``"tf_keras"``; default: `tfdist.compat.keras_flavour`.

    Attributes:
        broadcast_count: How many variables the last ``fit`` broadcast.

    Example:
        >>> callback = BroadcastVariablesCallback(root_rank=0, flavour="keras3")
        >>> import keras; isinstance(callback, keras.callbacks.Callback)
        True
    """

    def __init__(self, root_rank: int = 0, *, flavour: compat.KerasFlavour | None = None) -> None:
        super().__init__()
        self._init_broadcast(root_rank)


class _MetricAverageLogic:
    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs.update(ops.average_scalars(logs))


class MetricAverageCallback(_MetricAverageLogic, _FlavouredCallback):
    """Replaces each numeric epoch-end log (``loss``, metrics, ``val_*``) by its mean over ranks.

    Per-batch logs (the progress bar) stay per rank. With equal per-rank batch sizes, the mean of
    the ranks' epoch means equals the epoch mean over the whole global data. Put it before
    callbacks that read the logs (``ModelCheckpoint``, ``EarlyStopping``); ``History`` runs last
    and records the averaged values.

    Args:
        flavour: ``"keras3"`` or ``"tf_keras"``; default: `tfdist.compat.keras_flavour`.

    Example:
        >>> callback = MetricAverageCallback(flavour="keras3")
        >>> logs = {"loss": 0.25}
        >>> callback.on_epoch_end(0, logs); logs  # one process
        {'loss': 0.25}
    """

    def __init__(self, *, flavour: compat.KerasFlavour | None = None) -> None:
        super().__init__()
