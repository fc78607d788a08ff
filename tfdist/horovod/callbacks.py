"""Horovod's Keras callbacks, bound to the Keras flavour asked for.

The logic is Horovod's own (``horovod._keras.callbacks``: ``BroadcastGlobalVariablesCallbackImpl``
and ``MetricAverageCallbackImpl``, as patched by ``launch/horovod-patches/09``); Horovod binds it
to the ``Callback`` class of ``tf.keras``. tfdist binds the same logic to the ``Callback`` base of
a requested flavour (Keras 3 or tf-keras), so ``isinstance(cb, BroadcastVariablesCallback)`` holds
and either ``fit`` accepts it. The flavour defaults to `tfdist.core.flavour.keras_flavour` (tf-keras
when ``TF_USE_LEGACY_KERAS=1``), which is also what Horovod's own classes bind to.

Example:
    ::

        model.fit(x, y, callbacks=[BroadcastVariablesCallback(), MetricAverageCallback()])
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

from tfdist.core.flavour import KerasFlavour, get_keras, keras_flavour
from tfdist.horovod import runtime

__all__ = ["BroadcastVariablesCallback", "MetricAverageCallback"]

_BOUND: dict[tuple[type, str], type] = {}


def _implementation(name: str) -> type:
    """A ``*Impl`` class of ``horovod._keras.callbacks`` (initialises Horovod, or says the fix)."""
    runtime.init()
    return getattr(importlib.import_module("horovod._keras.callbacks"), name)


class _FlavouredCallback:
    """Instantiating a subclass yields an instance of it, Horovod's logic and a flavour's base."""

    _horovod_impl: ClassVar[str]

    def __new__(cls, *args: Any, flavour: KerasFlavour | None = None, **kwargs: Any) -> Any:
        flavour = flavour or keras_flavour()
        key = (cls, flavour)
        if key not in _BOUND:
            bases = (cls, _implementation(cls._horovod_impl),
                     get_keras(flavour).callbacks.Callback)
            _BOUND[key] = type(cls.__name__, bases, {"__module__": cls.__module__,
                                                     "__qualname__": cls.__qualname__})
        return object.__new__(_BOUND[key])

    def _impl_init(self, *args: Any) -> None:
        # The backend serves TF1 graph mode only; eager TF2 never touches it.
        backend = runtime.keras_api().K
        _implementation(self._horovod_impl).__init__(self, backend, *args)


class BroadcastVariablesCallback(_FlavouredCallback):
    """Copies rank ``root_rank``'s model and optimizer variables to every rank when ``fit`` starts.

    Broadcasts when training begins (so the first step already matches one process) and again
    after the first batch (optimizer slots tf-keras creates in that step). Every rank must have
    the same model (same variables, same order).

    Args:
        root_rank: The rank whose values win.
        flavour: ``"keras3"`` or ``"tf_keras"``; default: `tfdist.core.flavour.keras_flavour`.

    Example:
        >>> callback = BroadcastVariablesCallback(root_rank=0, flavour="keras3")
        >>> import keras; isinstance(callback, keras.callbacks.Callback)
        True
    """

    _horovod_impl = "BroadcastGlobalVariablesCallbackImpl"

    def __init__(self, root_rank: int = 0, *, flavour: KerasFlavour | None = None) -> None:
        self._impl_init(root_rank)


class MetricAverageCallback(_FlavouredCallback):
    """Replaces each numeric epoch-end log (``loss``, metrics, ``val_*``) by its mean over ranks.

    Per-batch logs (the progress bar) stay per rank; non-numeric entries are left as they are.
    With equal per-rank batch sizes, the mean of the ranks' epoch means equals the epoch mean over
    the whole global data. Put it before callbacks that read the logs (``ModelCheckpoint``,
    ``EarlyStopping``); ``History`` runs last and records the averaged values.

    Args:
        flavour: ``"keras3"`` or ``"tf_keras"``; default: `tfdist.core.flavour.keras_flavour`.

    Example:
        >>> callback = MetricAverageCallback(flavour="keras3")
        >>> logs = {"loss": 0.25, "note": "x"}
        >>> callback.on_epoch_end(0, logs); logs  # one process
        {'loss': 0.25, 'note': 'x'}
    """

    _horovod_impl = "MetricAverageCallbackImpl"

    def __init__(self, *, flavour: KerasFlavour | None = None) -> None:
        self._impl_init()
