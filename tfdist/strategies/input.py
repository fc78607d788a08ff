"""How a strategy feeds its workers: the input context and each worker's shard of the data.

`InputMixin` is the input half of `tfdist.strategies.base.TfdistStrategyMixin`; a backend changes
it by overriding `_distribute_dataset_fn` (default: ``distribute_datasets_from_function``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import tensorflow as tf

from tfdist.errors import StrategyConfigError, format_error

__all__ = ["HOST_INPUT", "DatasetFn", "InputMixin", "feeds_its_host_device", "shard_for"]

DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]
"""``dataset_fn(input_context) -> tf.data.Dataset``, the input contract of every strategy."""


def shard_for(dataset: tf.data.Dataset, context: tf.distribute.InputContext) -> tf.data.Dataset:
    """Keeps the elements of ``dataset`` that belong to ``context``'s input pipeline.

    Element ``i`` goes to pipeline ``i % num_input_pipelines``. On a batched dataset this deals
    whole batches: with 2 workers, worker 0 gets batches 0, 2, 4... and worker 1 batches 1, 3, 5...,
    so the global batch of step ``k`` is batches ``2k`` and ``2k+1`` together.

    Example:
        >>> ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1)
        >>> [int(x) for x in shard_for(tf.data.Dataset.range(6), ctx)]
        [1, 3, 5]
    """
    if context.num_input_pipelines <= 1:
        return dataset
    return dataset.shard(context.num_input_pipelines, context.input_pipeline_id)


HOST_INPUT = tf.distribute.InputOptions(
    experimental_fetch_to_device=False,
    experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA)
"""How a distributed dataset is iterated where a process has one replica on its host CPU: a plain
iterator on that device. TensorFlow's default builds a ``MultiDeviceIterator`` for every iterator
(every epoch of ``fit``, every ``evaluate`` and ``predict``), tracing its six functions each time
to prefetch onto the one device the data is already on. Measured (2 cores, a 20-32-10 MLP, 8
steps an epoch): a worker of a 2-worker multi_worker job took 3.32 CPU-s for 10 epochs with it,
1.79 without; one process under ``default`` 2.08 and 0.54 (as Keras without a strategy: 0.55)."""


def feeds_its_host_device(strategy: tf.distribute.Strategy) -> bool:
    """True when ``strategy`` runs one replica in this process, on a CPU (`HOST_INPUT` applies).

    Example:
        >>> import tfdist.strategies
        >>> feeds_its_host_device(tfdist.strategies.get_strategy("default"))
        True
    """
    devices = strategy.extended.worker_devices
    return len(devices) == 1 and tf.DeviceSpec.from_string(devices[0]).device_type == "CPU"


def _sharded(dataset_fn: DatasetFn) -> DatasetFn:
    def sharded_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        dataset = dataset_fn(context)
        if not isinstance(dataset, tf.data.Dataset):
            raise StrategyConfigError(
                format_error(
                    "dataset_fn must return a tf.data.Dataset.",
                    received=type(dataset).__name__,
                    expected="tf.data.Dataset",
                    fix="return tf.data.Dataset.from_tensor_slices(...).batch(...) from dataset_fn",
                )
            )
        return shard_for(dataset, context)

    return sharded_fn


def _resumable(dataset_fn: DatasetFn, skip: tf.Variable) -> DatasetFn:
    def resumable_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        from tfdist.resilience.preemption import skip_at_start

        return skip_at_start(dataset_fn(context), skip)

    return resumable_fn


class InputMixin:
    """`input_context` and `distribute_dataset`, for `TfdistStrategyMixin` (which supplies
    ``num_workers``, ``worker_index``, ``num_replicas`` and ``preemption_saves``); TensorFlow's
    two ways of distributing a dataset, iterated with `HOST_INPUT` where it applies."""

    _iterates_on_host: ClassVar[bool] = True
    """False for a strategy whose datasets are not iterated by this process (ParameterServer's
    are made on its workers)."""

    def experimental_distribute_dataset(self, dataset: tf.data.Dataset,
                                        options: Any = None) -> Any:
        """TensorFlow's, iterated with `HOST_INPUT` where it applies (what ``fit`` calls).

        Example:
            >>> import tfdist.strategies
            >>> strategy = tfdist.strategies.get_strategy("default")
            >>> dataset = tf.data.Dataset.range(4).batch(2)
            >>> [b.numpy().tolist() for b in strategy.experimental_distribute_dataset(dataset)]
            [[0, 1], [2, 3]]
        """
        distributed = super().experimental_distribute_dataset(dataset, options)  # type: ignore[misc]
        return self._iterated_on_host(distributed, options)

    def distribute_datasets_from_function(self, dataset_fn: DatasetFn, options: Any = None) -> Any:
        """TensorFlow's, iterated with `HOST_INPUT` where it applies."""
        distributed = super().distribute_datasets_from_function(  # type: ignore[misc]
            dataset_fn, options)
        return self._iterated_on_host(distributed, options)

    def _iterated_on_host(self, distributed: Any, options: Any) -> Any:
        """``distributed``, iterated with `HOST_INPUT` where it applies and the caller chose no
        options. The dataset was built with TensorFlow's defaults (the same shards, rebatching
        and element spec); only how each new iterator reads it changes: the same batches."""
        if self._iterates_on_host and options is None and \
                getattr(distributed, "_options", "absent") is None and \
                feeds_its_host_device(self):  # type: ignore[arg-type]
            distributed._options = HOST_INPUT  # noqa: SLF001 - read by each __iter__; no setter
        return distributed

    def input_context(self) -> tf.distribute.InputContext:
        """The `tf.distribute.InputContext` of this process's input pipeline.

        Example:
            >>> import tfdist.strategies
            >>> ctx = tfdist.strategies.get_strategy("default").input_context()
            >>> ctx.num_input_pipelines, ctx.input_pipeline_id
            (1, 0)
        """
        return tf.distribute.InputContext(
            num_input_pipelines=self.num_workers,
            input_pipeline_id=self.worker_index,
            num_replicas_in_sync=self.num_replicas,
        )

    def distribute_dataset(
        self, dataset_fn: DatasetFn, *, shard: bool = True, options: Any = None
    ) -> Any:
        """Builds each worker's input from ``dataset_fn(input_context)``, in what ``fit`` accepts.

        Args:
            dataset_fn: Returns the dataset of one worker. Batch it with
                ``input_context.get_per_replica_batch_size(global_batch)`` (or a per-replica
                size). It runs on every worker (on ParameterServer: on every ``worker`` task).
            shard: If True (default), the returned dataset is sharded by element with `shard_for`,
                so workers get disjoint elements (whole batches, if ``dataset_fn`` batches). Pass
                False when ``dataset_fn`` shards by itself with ``input_context``.
            options: ``tf.distribute.InputOptions`` passed through to TensorFlow.

        Returns:
            What ``model.fit`` takes for this backend: a `tf.distribute.DistributedDataset`
            for the in-graph strategies, a ``DatasetCreator`` for ParameterServer.

        Example:
            >>> import tfdist.strategies
            >>> strategy = tfdist.strategies.get_strategy("default")
            >>> def dataset_fn(ctx):
            ...     return tf.data.Dataset.range(8).batch(ctx.get_per_replica_batch_size(4))
            >>> [b.numpy().tolist() for b in strategy.distribute_dataset(dataset_fn)]
            [[0, 1, 2, 3], [4, 5, 6, 7]]
        """
        if not callable(dataset_fn):
            raise StrategyConfigError(
                format_error(
                    "distribute_dataset needs a function, not a dataset.",
                    received=type(dataset_fn).__name__,
                    expected="dataset_fn(input_context) -> tf.data.Dataset",
                    fix="wrap it: strategy.distribute_dataset(lambda ctx: dataset)",
                )
            )
        fn = _sharded(dataset_fn) if shard else dataset_fn
        if self.preemption_saves:
            fn = _resumable(fn, self._tfdist_input_skip)
        return self._distribute_dataset_fn(fn, options)

    def _resume_input_at(self, global_step: int) -> None:
        """Makes the next input iterator start where step ``global_step`` left the stream."""
        if self.preemption_saves:
            local_replicas = max(1, self.num_replicas // self.num_workers)
            self._tfdist_input_skip.assign(global_step * local_replicas)

    def _distribute_dataset_fn(self, dataset_fn: DatasetFn, options: Any) -> Any:
        distribute = self.distribute_datasets_from_function  # type: ignore[attr-defined]
        return distribute(dataset_fn, options)
