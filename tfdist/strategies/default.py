"""``"default"``: one device, no cluster (a tfdist `tf.distribute.OneDeviceStrategy`).

TensorFlow's own default strategy (``tf.distribute.get_strategy()`` outside any scope) is a
private class that cannot be subclassed, so tfdist's ``default`` is a `OneDeviceStrategy` on the
first GPU if there is one, else on the CPU: the same single-replica training, with a ``scope()``.
"""

from __future__ import annotations

import tensorflow as tf

from tfdist.core import traits as builtin
from tfdist.errors import StrategyConfigError, format_error
from tfdist.strategies.base import TfdistStrategyMixin

__all__ = ["DefaultStrategy"]


class DefaultStrategy(TfdistStrategyMixin, tf.distribute.OneDeviceStrategy):
    """Trains on one device of this host.

    Args:
        device: A device string such as ``"/cpu:0"`` or ``"/gpu:1"``; None picks ``"/gpu:0"`` if
            a GPU is visible, else ``"/cpu:0"``.

    Example:
        >>> strategy = DefaultStrategy()
        >>> strategy.name, strategy.num_replicas_in_sync, strategy.is_chief
        ('default', 1, True)
    """

    name = "default"
    traits = builtin.DEFAULT

    def __init__(self, device: str | None = None) -> None:
        self._check_keras()
        if device is None:
            device = "/gpu:0" if tf.config.list_physical_devices("GPU") else "/cpu:0"
        elif not isinstance(device, str) or not device.strip():
            raise StrategyConfigError(
                format_error("Invalid value for option 'device'.", received=f"device={device!r}",
                             expected="a device string such as '/cpu:0' or '/gpu:0'",
                             fix="pass one device, or leave it out"))
        super().__init__(device)
        self._init_tfdist()
