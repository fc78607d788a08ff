"""``"horovod"``: a ``tf.distribute.Strategy`` whose cross-replica reductions are Horovod's.

One replica per process (started by ``horovodrun``/``mpirun``), ``num_replicas_in_sync`` equal to
Horovod's size, and every reduction an all-reduce over the Horovod ranks. Keras then trains with
it exactly as with ``MirroredStrategy``: with Keras 3 *and* tf-keras, which makes it the way to
train multi-process under Keras 3 on TF 2.21 (Keras 3's ``model.fit`` fails under
``MultiWorkerMirroredStrategy``).

How it works (`HorovodExtended`, built on ``OneDeviceStrategy``'s single-device machinery):

* ``_num_replicas_in_sync`` is ``hvd.size()``. Keras divides each replica's loss by it (Keras 3
  in ``Loss.__call__``, tf-keras in its ``LossesContainer``), so the gradient of a replica's loss
  is its share of the global-batch gradient.
* Keras's optimizers (both flavours) sum those shares with the replica context's ``all_reduce``
  before applying them. `HorovodExtended._replica_ctx_all_reduce` makes that one grouped (fused)
  Horovod all-reduce; ``_use_merge_call`` is False so both flavours take that path. Cross-replica
  ``strategy.reduce`` / ``extended.reduce_to`` / ``batch_reduce_to`` / ``gather`` are Horovod
  collectives too.
* Every variable created under ``scope()`` takes rank 0's initial value (its initializer is
  followed by a Horovod broadcast), so ranks start equal without any callback.
* ``experimental_distribute_dataset`` (what ``fit`` calls) gives each rank its slice of every
  global batch, like ``MirroredStrategy`` does with devices; ``distribute_datasets_from_function``
  passes an ``InputContext`` with one input pipeline per rank.
* Rank 0 is the chief: it alone checkpoints, saves and writes summaries.

Per-step logs (``loss``, metrics) are this rank's; `callbacks` adds
`tfdist.horovod.MetricAverageCallback` (epoch-end logs averaged over ranks) and
`tfdist.horovod.BroadcastVariablesCallback` (a safety net for variables created outside scope).

``evaluate`` and ``predict`` (Keras 3; ``validation_data`` in ``fit`` too) run on each rank
alone, on the whole input (`runs_locally`): every rank returns the whole model's result, as one
process would, and a call on rank 0 alone works (split into slices, each rank would return its
own rows and metrics). Limits: every rank
must create the same variables in the same order under ``scope()`` (each creation is a
broadcast); build anything rank-specific outside it. Keras 3 applies ``clipnorm``/``clipvalue``
to each replica's gradient before the all-reduce (as under ``MirroredStrategy``); tf-keras clips
the reduced one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import distribute_lib, input_util, one_device_strategy
from tensorflow.python.util import nest

from tfdist.cluster import ClusterSpec, Task
from tfdist.core import traits as builtin
from tfdist.horovod import data, ops, runtime
from tfdist.strategies.base import TfdistStrategyMixin

__all__ = ["HorovodStrategy", "HorovodExtended", "nominal_cluster"]


def _broadcast_initial_value(initial_value: Any, dtype: Any) -> Any:
    """Wraps a variable's initial value so that it evaluates to rank 0's value (same context)."""

    def value() -> Any:
        local = initial_value() if callable(initial_value) else initial_value
        return ops.broadcast_tensor(local, root_rank=0, dtype=dtype)

    return value


class _HorovodReplicaContext(distribute_lib.ReplicaContext):
    """The replica context of this process: replica id = Horovod rank."""

    def __init__(self, strategy: tf.distribute.Strategy, rank: int) -> None:
        distribute_lib.ReplicaContext.__init__(self, strategy, replica_id_in_sync_group=rank)

    @property
    def devices(self) -> tuple[str, ...]:
        return self._strategy.extended.worker_devices


class HorovodExtended(one_device_strategy.OneDeviceExtended):
    """``OneDeviceExtended`` with Horovod collectives for every cross-replica operation.

    Example:
        >>> extended = HorovodStrategy().extended
        >>> extended._num_replicas_in_sync, extended._use_merge_call(), extended.should_checkpoint
        (1, False, True)
    """

    _tfdist_horovod = True  # tfdist.horovod.DistributedOptimizer steps aside under this strategy

    def __init__(self, container_strategy: tf.distribute.Strategy, device: str, *,
                 compression: str | None, split_batches: bool) -> None:
        super().__init__(container_strategy, device)
        self._compression = compression
        self._split_batches = split_batches
        self._rank, self._size = runtime.rank(), runtime.size()
        self._local_variables_only = False

    # ------------------------------------------------------------------ replicas
    @property
    def _num_replicas_in_sync(self) -> int:
        return self._size

    def _use_merge_call(self) -> bool:
        return False

    def _call_for_each_replica(self, fn: Any, args: Any, kwargs: Any) -> Any:
        with tf.device(self._device), _HorovodReplicaContext(self._container_strategy(),
                                                             self._rank):
            return fn(*args, **kwargs)

    def _get_local_replica_id(self, replica_id_in_sync_group: Any) -> int:
        return 0

    # ---------------------------------------------------------------- reductions
    def _replica_ctx_all_reduce(self, reduce_op: Any, value: Any, options: Any = None) -> Any:
        flat = nest.flatten(value)
        reduced = ops.allreduce(flat, op=reduce_op, compression=self._compression)
        return nest.pack_sequence_as(value, reduced)

    def _reduce_to(self, reduce_op: Any, value: Any, destinations: Any, options: Any) -> Any:
        return ops.allreduce([tf.convert_to_tensor(value)], op=reduce_op)[0]

    def _batch_reduce_to(self, reduce_op: Any, value_destination_pairs: Any, options: Any) -> Any:
        values = [tf.convert_to_tensor(value) for value, _ in value_destination_pairs]
        return ops.allreduce(values, op=reduce_op)

    def _gather_to_implementation(self, value: Any, destinations: Any, axis: Any,
                                  options: Any) -> Any:
        return ops.allgather(value, axis=int(axis))

    # ----------------------------------------------------------------- variables
    def _create_variable(self, next_creator: Any, **kwargs: Any) -> Any:
        if not self._local_variables_only:
            kwargs["initial_value"] = _broadcast_initial_value(kwargs["initial_value"],
                                                               kwargs.get("dtype"))
        return super()._create_variable(next_creator, **kwargs)

    @contextlib.contextmanager
    def local_variables(self) -> Iterator[None]:
        """Variables created inside are this rank's own: no broadcast (a collective) is started.

        For code that runs on some ranks only, such as a chief-only checkpoint save: a
        ``tf.train.Checkpoint`` creates its ``save_counter`` on its first save, and Keras runs
        callbacks inside the strategy's scope, so without this the save would wait forever for
        the other ranks to join a broadcast.
        """
        previous, self._local_variables_only = self._local_variables_only, True
        try:
            yield
        finally:
            self._local_variables_only = previous

    # --------------------------------------------------------------------- input
    def _experimental_distribute_dataset(self, dataset: tf.data.Dataset, options: Any) -> Any:
        if self._split_batches:
            dataset = data.split_global_batches(dataset, self._size, self._rank)
        return super()._experimental_distribute_dataset(dataset, options)

    def _distribute_datasets_from_function(self, dataset_fn: Any, options: Any) -> Any:
        context = tf.distribute.InputContext(num_input_pipelines=self._size,
                                             input_pipeline_id=self._rank,
                                             num_replicas_in_sync=self._size)
        return input_util.get_distributed_datasets_from_function(
            dataset_fn, self._input_workers_with_options(options), [context],
            self._container_strategy(), options=options)

    def _experimental_distribute_values_from_function(self, value_fn: Any) -> Any:
        return value_fn(tf.distribute.experimental.ValueContext(self._rank, self._size))

    # -------------------------------------------------------------------- saving
    @property
    def should_checkpoint(self) -> bool:
        return self._rank == 0

    @property
    def should_save_summary(self) -> bool:
        return self._rank == 0


def nominal_cluster(size: int) -> ClusterSpec:
    """The `cluster` of a Horovod job: one worker per rank, at nominal addresses.

    Horovod ranks talk through Gloo or MPI, not TensorFlow servers, so nothing listens there;
    the spec only says how many workers there are and which one this process is.

    Example:
        >>> nominal_cluster(2).worker
        ('horovod-rank-0:2222', 'horovod-rank-1:2222')
    """
    return ClusterSpec(worker=tuple(f"horovod-rank-{i}:2222" for i in range(size)))


def _pick_device() -> str:
    """``/gpu:0`` after making this rank's GPU (``local_rank``) the only visible one, else CPU."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "/cpu:0"
    try:
        tf.config.set_visible_devices(gpus[runtime.local_rank() % len(gpus)], "GPU")
    except RuntimeError:  # TensorFlow already initialised its devices: keep them.
        return f"/gpu:{runtime.local_rank() % len(gpus)}"
    return "/gpu:0"


class HorovodStrategy(TfdistStrategyMixin, tf.distribute.OneDeviceStrategy):
    """Synchronous data parallelism over Horovod processes, one replica each.

    Start one process per replica with ``horovodrun -np N --gloo python train.py`` (or
    ``mpirun``). Build and compile the model under ``strategy.scope()``; give ``fit`` the global
    batch (``strategy.global_batch_size(per_replica)``): each rank trains on its slice.

    Args:
        compression: None, or ``"fp16"`` to send gradients as float16.
        fusion_threshold_bytes: Horovod's tensor-fusion buffer (``HOROVOD_FUSION_THRESHOLD``),
            applied if Horovod is not yet initialised. None: the environment's (64 MiB default).
        cycle_time_ms: Horovod's fusion cycle (``HOROVOD_CYCLE_TIME``); None: environment's.
        split_batches: True (default): each rank takes its slice of every batch of a dataset
            given to ``fit``. False: each rank's dataset already yields its own batches (the
            Horovod idiom ``dataset.shard(size, rank)``; all ranks must yield as many batches).
        device: This replica's device; None: this rank's GPU (``local_rank``), else the CPU.

    Example:
        Under ``horovodrun -np 2 --gloo``::

            strategy = tfdist.get_strategy("horovod")
            with strategy.scope():
                model = build_model()
                model.compile(optimizer="sgd", loss="mse")
            model.fit(x, y, batch_size=strategy.global_batch_size(32),
                      callbacks=strategy.callbacks())

        In one process (size 1):

        >>> strategy = HorovodStrategy()
        >>> strategy.num_replicas_in_sync, strategy.is_chief, str(strategy.task)
        (1, True, 'worker:0')
        >>> strategy.describe()
        'horovod: task worker:0, 1 worker(s), 1 replica(s) in sync, chief'
    """

    per_rank_backups = True

    def _writing(self) -> contextlib.AbstractContextManager[None]:
        return self.extended.local_variables()

    name = "horovod"
    traits = builtin.HOROVOD

    def __init__(self, compression: str | None = None, fusion_threshold_bytes: int | None = None,
                 cycle_time_ms: float | None = None, split_batches: bool = True,
                 device: str | None = None) -> None:
        self._check_keras()
        ops.check_compression(compression)
        runtime.init(fusion_threshold_bytes=fusion_threshold_bytes, cycle_time_ms=cycle_time_ms)
        extended = HorovodExtended(self, device or _pick_device(), compression=compression,
                                   split_batches=bool(split_batches))
        distribute_lib.Strategy.__init__(self, extended)
        self._init_tfdist(nominal_cluster(extended._size), Task("worker", extended._rank))

    def runs_locally(self, method: str, x: Any = None) -> bool:
        """``evaluate`` and ``predict`` run on this rank alone, whole (see the module docstring).

        Example:
            >>> HorovodStrategy().runs_locally("predict")
            True
        """
        return method in ("evaluate", "predict")

    def _backend_callbacks(self) -> list[Any]:
        """``[BroadcastVariablesCallback(0), MetricAverageCallback()]`` for this Keras flavour.

        Example:
            >>> [type(c).__name__ for c in HorovodStrategy()._backend_callbacks()]
            ['BroadcastVariablesCallback', 'MetricAverageCallback']
        """
        from tfdist.horovod.callbacks import BroadcastVariablesCallback, MetricAverageCallback

        return [BroadcastVariablesCallback(0), MetricAverageCallback()]
