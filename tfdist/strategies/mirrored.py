"""``"mirrored"``: synchronous training on several devices of one host.

A tfdist `tf.distribute.MirroredStrategy`: every device holds a copy of each variable and the
gradients are all-reduced each step. Works with both Keras flavours.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tfdist.core import traits as builtin
from tfdist.errors import StrategyConfigError, format_error
from tfdist.options import check_choice
from tfdist.strategies.base import TfdistStrategyMixin

__all__ = ["MirroredStrategy", "CROSS_DEVICE_OPS"]

CROSS_DEVICE_OPS = {
    "nccl": tf.distribute.NcclAllReduce,
    "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
    "reduce_to_one": tf.distribute.ReductionToOneDevice,
}
"""Names accepted for ``cross_device_ops`` -> the TF class (created with its defaults)."""


def _check_devices(devices: object) -> list[str] | None:
    if devices is None:
        return None
    if isinstance(devices, str) or not isinstance(devices, Sequence) or not devices or not all(
        isinstance(d, str) and d for d in devices
    ):
        raise StrategyConfigError(
            format_error("Invalid value for option 'devices'.", received=f"devices={devices!r}",
                         expected="a non-empty list of device strings, e.g. ['/gpu:0', '/gpu:1']",
                         fix="pass a list (not one string), or leave it out to use every GPU"))
    return list(devices)


def _cross_device_ops(value: object) -> tf.distribute.CrossDeviceOps | None:
    if value is None or isinstance(value, tf.distribute.CrossDeviceOps):
        return value
    check_choice("cross_device_ops", value, tuple(CROSS_DEVICE_OPS),
                 fix="pass one of these names or a tf.distribute.CrossDeviceOps instance")
    return CROSS_DEVICE_OPS[value]()


class MirroredStrategy(TfdistStrategyMixin, tf.distribute.MirroredStrategy):
    """Synchronous data parallelism over the devices of this host.

    Args:
        devices: Device strings to replicate on; None: every GPU, or the CPU if there is none.
        cross_device_ops: How gradients are reduced: ``"nccl"``, ``"hierarchical_copy"``,
            ``"reduce_to_one"``, a ``tf.distribute.CrossDeviceOps``, or None for TF's choice.

    Example:
        >>> strategy = MirroredStrategy(devices=["/cpu:0"])
        >>> strategy.num_replicas_in_sync, strategy.global_batch_size(16)
        (1, 16)
    """

    name = "mirrored"
    traits = builtin.MIRRORED

    def __init__(
        self,
        devices: Sequence[str] | None = None,
        cross_device_ops: str | tf.distribute.CrossDeviceOps | None = None,
    ) -> None:
        devices = _check_devices(devices)
        reduce_ops = _cross_device_ops(cross_device_ops)
        self._check_keras()
        super().__init__(devices=devices, cross_device_ops=reduce_ops)
        self._init_tfdist()
