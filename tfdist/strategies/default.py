"""``"default"``: one device, no cluster (a tfdist `tf.distribute.OneDeviceStrategy`).

TensorFlow's own default strategy (``tf.distribute.get_strategy()`` outside any scope) is a
private class that cannot be subclassed, so tfdist's ``default`` is a `OneDeviceStrategy` on the
first GPU if there is one, else on the CPU: the same single-replica training, with a ``scope()``.

It trains alone, but a process with a TF_CONFIG may still be one task of a larger job (the
evaluator beside a training cluster, above all): there it reads TF_CONFIG as strictly as every
other strategy, reports that task, and is the chief only if the job says so, so "write only on
the chief" holds in every process of the job.
"""

from __future__ import annotations

import os

import tensorflow as tf

from tfdist.cluster import ClusterSpec, Task, read_tf_config
from tfdist.core import traits as builtin
from tfdist.core.environ import TF_CONFIG
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
        job = _job_from_tf_config()
        if job is not None:
            self._tfdist_task, self._tfdist_chief_of_job = job[1], _is_job_chief(*job)

    @property
    def is_chief(self) -> bool:
        """True unless TF_CONFIG makes this process a task other than its job's chief.

        The evaluator is never the chief.
        """
        return getattr(self, "_tfdist_chief_of_job", True)


def _job_from_tf_config() -> tuple[ClusterSpec, Task] | None:
    """This process's job and task from TF_CONFIG (None when unset), checked strictly.

    Raises:
        ClusterConfigError: TF_CONFIG is set but invalid (a mis-cased role, a bad address...).
    """
    if not os.environ.get(TF_CONFIG, "").strip():
        return None
    return read_tf_config()


def _is_job_chief(cluster: ClusterSpec, task: Task) -> bool:
    if cluster.chief:
        return task.type == "chief"
    return task.type == "worker" and task.index == 0
