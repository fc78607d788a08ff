"""``"parameter_server"``: asynchronous training with variables on ps tasks (either Keras).

A tfdist `tf.distribute.experimental.ParameterServerStrategy`. Only the **chief** runs the
training script: it is the coordinator, which places variables on the ``ps`` tasks and sends
steps to the ``worker`` tasks. ``worker`` and ``ps`` tasks run ``python -m tfdist.server``
(`tfdist.server.serve`) and do nothing else.

Keras: tf-keras's ``model.fit`` drives the coordinator itself. Keras 3's cannot (keras#18624):
tfdist's shim routes Keras 3's ``model.fit``/``evaluate`` to its own coordinator loop
(`tfdist.coordinator_fit`), which `tfdist.fit` also runs (``tfdist.fit(model,
strategy.distribute_dataset(fn), epochs=..., steps_per_epoch=...)`` works with the shims off too).
``predict``, and ``evaluate`` of in-memory data, run on the coordinator itself (`runs_locally`).

Input: `distribute_dataset` returns a tf-keras ``DatasetCreator`` (Keras 3: a
`tfdist.training.PerWorkerInput` for `tfdist.fit`); ``fit`` runs its
``dataset_fn`` on each worker with ``input_context.num_input_pipelines`` = the number of workers and
``input_pipeline_id`` = that worker's index (a scalar tensor: TF traces ``dataset_fn`` once), so
each worker reads its own shard (TF's own context would give every worker the whole dataset).
``fit`` needs ``steps_per_epoch``; repeat the dataset.

Step size: a step runs on one worker (``num_replicas_in_sync`` is 1 per worker on CPU, its GPU
count otherwise) and steps of different workers are applied asynchronously, not averaged; so
`global_batch_size` and `scale_learning_rate` scale by that per-step replica count only.

Sharding variables: pass ``num_shards`` (``FixedShardsPartitioner``: every variable in that many
pieces along its first axis, placed round-robin on the ps tasks), ``min_shard_bytes``
(``MinSizePartitioner``: pieces of at least that size, at most one per ps), or any
``variable_partitioner``. By default variables are not partitioned; whole variables are placed
round-robin on the ps tasks. Sharding needs tf-keras: under Keras 3 a partitioner is refused
(`check_partitioner`); measured on a 4096 x 32 table, one ``Embedding`` per ps task spreads it
as evenly as ``num_shards=2`` and trains (docs/compatibility.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from tfdist.cluster import Task
from tfdist.coordinator_fit import PerWorkerInput, per_worker_dataset_fn
from tfdist.core import traits as builtin
from tfdist.core.flavour import KerasFlavour, get_keras, keras_flavour
from tfdist.errors import KerasCompatibilityError, StrategyConfigError, format_error
from tfdist.options import check_positive_int, check_positive_number
from tfdist.strategies.base import TfdistStrategyMixin, cluster_resolver
from tfdist.strategies.input import DatasetFn
from tfdist.strategies.startup import resolve_startup_timeout, startup_deadline

__all__ = ["ParameterServerStrategy", "check_partitioner", "make_partitioner"]

_partitioners = tf.distribute.experimental.partitioners


def make_partitioner(
    num_ps: int,
    num_shards: int | None = None,
    min_shard_bytes: int | None = None,
    variable_partitioner: Any = None,
) -> Any:
    """The variable partitioner asked for (at most one way), or None for no partitioning.

    Example:
        >>> type(make_partitioner(2, num_shards=2)).__name__
        'FixedShardsPartitioner'
        >>> make_partitioner(2) is None
        True
    """
    given = [n for n, v in (("num_shards", num_shards), ("min_shard_bytes", min_shard_bytes),
                            ("variable_partitioner", variable_partitioner)) if v is not None]
    if len(given) > 1:
        raise StrategyConfigError(
            format_error("Options that choose a variable partitioner exclude each other.",
                         received=", ".join(given), expected="at most one of them",
                         fix="keep num_shards, min_shard_bytes or variable_partitioner"))
    if num_shards is not None:
        return _partitioners.FixedShardsPartitioner(check_positive_int("num_shards", num_shards))
    if min_shard_bytes is not None:
        return _partitioners.MinSizePartitioner(
            min_shard_bytes=check_positive_int("min_shard_bytes", min_shard_bytes),
            max_shards=num_ps,
        )
    if variable_partitioner is not None and not callable(variable_partitioner):
        raise StrategyConfigError(
            format_error("Invalid value for option 'variable_partitioner'.",
                         received=f"variable_partitioner={variable_partitioner!r}",
                         expected="a tf.distribute.experimental.partitioners.Partitioner",
                         fix="pass e.g. tf.distribute.experimental.partitioners."
                         "FixedShardsPartitioner(2), or use num_shards=2"))
    return variable_partitioner


class ParameterServerStrategy(
    TfdistStrategyMixin, tf.distribute.experimental.ParameterServerStrategy
):
    """Variables on ps tasks, steps on worker tasks, coordinated from the chief.

    Args:
        num_shards: Split each variable in this many shards (``FixedShardsPartitioner``).
        min_shard_bytes: Split variables in shards of at least this many bytes, at most one per
            ps (``MinSizePartitioner``).
        variable_partitioner: Any TF partitioner (excludes the two options above).
        startup_timeout_seconds: Deadline for connecting to the workers and ps tasks (None:
            $TFDIST_STARTUP_TIMEOUT, else 600 s). Past it the process prints the tasks that do
            not answer and is killed (SIGKILL), instead of waiting forever as TF would.
        tf_config: The TF_CONFIG to use instead of the environment's (JSON text or a mapping).

    Raises:
        KerasCompatibilityError: a partitioner under Keras 3 (see `check_partitioner`).
        ClusterConfigError: TF_CONFIG is missing, invalid, or lacks a chief or ps.
        StrategyConfigError: this process is not the chief, or an option is invalid.

    Example:
        >>> strategy = ParameterServerStrategy(num_shards=2)  # doctest: +SKIP
        >>> with strategy.scope():  # doctest: +SKIP
        ...     model = tf_keras.Sequential([tf_keras.layers.Embedding(100, 8)])
    """

    name = "parameter_server"
    traits = builtin.PARAMETER_SERVER
    _iterates_on_host = False

    def __init__(
        self,
        num_shards: int | None = None,
        min_shard_bytes: int | None = None,
        variable_partitioner: Any = None,
        startup_timeout_seconds: float | None = None,
        tf_config: str | Mapping[str, Any] | None = None,
    ) -> None:
        deadline = check_positive_number(
            "startup_timeout_seconds", resolve_startup_timeout(startup_timeout_seconds)
        )
        make_partitioner(1, num_shards, min_shard_bytes, variable_partitioner)  # checks options
        self._check_keras()
        cluster, task = self._read_cluster(tf_config)
        partitioner = make_partitioner(
            len(cluster.ps), num_shards, min_shard_bytes, variable_partitioner
        )
        check_partitioner(partitioner)
        with startup_deadline(deadline, cluster, task, f"ParameterServerStrategy on {task}"):
            super().__init__(cluster_resolver(cluster, task), variable_partitioner=partitioner)
        self._init_tfdist(cluster, task)

    @classmethod
    def _wrong_role_fix(cls, task: Task) -> str:
        if task.type in ("worker", "ps"):
            return (f"only the chief runs the training script; run `python -m tfdist.server` "
                    f"on {task} (tfdist-launch and tfdist.testing.run_cluster do this)")
        return super()._wrong_role_fix(task)

    @property
    def num_workers(self) -> int:
        """The ``worker`` tasks that run steps (the chief coordinates and runs none)."""
        return len(self.cluster.worker)

    @property
    def coordinator(self) -> tf.distribute.experimental.coordinator.ClusterCoordinator:
        """The `ClusterCoordinator` of this strategy (the one tf-keras's ``fit`` uses too)."""
        return tf.distribute.experimental.coordinator.ClusterCoordinator(self)

    def runs_locally(self, method: str, x: Any = None) -> bool:
        """``predict``, and ``evaluate`` of in-memory data or a ``tf.data.Dataset``, run on the
        coordinator alone (Keras 3): it reads the variables from the ps tasks and computes the
        whole result itself. ``evaluate`` of `distribute_dataset`'s input runs on the workers.

        Example:
            >>> import numpy as np
            >>> strategy = ParameterServerStrategy.__new__(ParameterServerStrategy)
            >>> strategy.runs_locally("evaluate", np.zeros((4, 2)))
            True
        """
        if method == "predict":
            return True
        return method == "evaluate" and not (
            isinstance(x, PerWorkerInput) or callable(x)
            or type(x).__name__ == "DatasetCreator")

    def _distribute_dataset_fn(self, dataset_fn: DatasetFn, options: Any) -> Any:
        worker_fn = per_worker_dataset_fn(dataset_fn, self.num_workers)
        if keras_flavour() == "keras3":

            return PerWorkerInput(dataset_fn, worker_fn, options)
        keras = get_keras("tf_keras")
        return keras.utils.experimental.DatasetCreator(worker_fn, input_options=options)


def check_partitioner(partitioner: Any, flavour: KerasFlavour | None = None) -> None:
    """Raises if variables cannot be sharded (a ParameterServer partitioner) under this Keras.

    Keras 3 keeps a TF variable inside its own; a partitioned one is a ``ShardedVariable``,
    which ``tf.GradientTape`` cannot differentiate against (it has no ``handle``; measured on
    Keras 3.15.1 with TF 2.21), so every train step would fail.

    Example:
        >>> check_partitioner(None, "keras3")
        >>> check_partitioner(object(), "keras3")
        Traceback (most recent call last):
        ...
        tfdist.errors.KerasCompatibilityError: ...
    """
    if partitioner is None or (flavour or keras_flavour()) != "keras3":
        return
    raise KerasCompatibilityError(format_error(
        "ParameterServerStrategy cannot shard variables under Keras 3: tf.GradientTape cannot "
        "differentiate a Keras 3 variable that holds a ShardedVariable.",
        received=f"a variable partitioner ({type(partitioner).__name__}) with Keras 3",
        expected="no num_shards, min_shard_bytes or variable_partitioner under Keras 3",
        fix="drop the partitioner (whole variables are then placed round-robin over the ps "
        "tasks), or train with tf-keras (TF_USE_LEGACY_KERAS=1) to shard them"))
