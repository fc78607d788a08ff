"""Tensors between processes over TensorFlow's collective runtime: send/recv and stage all-reduce.

With collective ops enabled on every process of the job (`enable_collectives`), a broadcast in a
group of two (``broadcast_send_v2`` on one side, ``broadcast_recv_v2`` on the other) moves one
tensor from one process to the other. Keys:

* group key of the pair of ranks ``a < b``: ``PAIR_GROUP_BASE + a * MAX_RANKS + b`` (one group
  per pair of neighbouring stages, both directions);
* group key of stage ``k``'s data-parallel group (its D replicas): ``STAGE_GROUP_BASE + k``;
* group key of replica ``d``'s K stages (the last stage shares loss, metrics and predictions):
  ``REPLICA_GROUP_BASE + d``;
* instance key (unique within a group): ``phase << 27 | kind << 24 | micro_batch << 12 |
  index``, ``kind`` one of `ACTIVATION`, `GRADIENT`, `WEIGHTS`, `REDUCE`, `SHARE`, `METRICS`;
  ``index`` numbers the tensors of one transfer (the variables of a weight transfer or an
  all-reduce); ``phase`` separates training, evaluation, prediction and custom-loop steps
  (`TRAIN`, `EVALUATE`, `PREDICT`, `CUSTOM`), whose tensors differ in shape: TensorFlow refuses
  one instance key used with two shapes.

Inside a ``tf.function`` an op whose output nothing uses is pruned: a pruned send leaves its
receiver waiting forever. Callers tie every send to the step's outputs
(``tf.control_dependencies``); `Link.send` returns the op's output for that.

Example:
    >>> pair_group_key(3, 2), instance_key(GRADIENT, micro_batch=1, index=0)
    (1056771, 33558528)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from tensorflow.python.ops import collective_ops

from tfdist.cluster import ClusterSpec, Task

__all__ = [
    "ACTIVATION",
    "GRADIENT",
    "WEIGHTS",
    "REDUCE",
    "MAX_RANKS",
    "pair_group_key",
    "stage_group_key",
    "replica_group_key",
    "instance_key",
    "Link",
    "group_broadcast",
    "all_reduce_mean",
    "enable_collectives",
]

ACTIVATION, GRADIENT, WEIGHTS, REDUCE, SHARE, METRICS = 1, 2, 3, 4, 5, 6
TRAIN, EVALUATE, PREDICT, CUSTOM = 0, 1, 2, 3
MAX_RANKS = 4096
PAIR_GROUP_BASE = 1 << 20
STAGE_GROUP_BASE = 1 << 19
REPLICA_GROUP_BASE = 1 << 18
WORLD_GROUP_KEY = 1 << 17
"""Every process of the job: used once, by `exit_barrier`."""
EXIT = 7


def pair_group_key(a: int, b: int) -> int:
    """The collective group of ranks ``a`` and ``b`` (order does not matter)."""
    low, high = sorted((a, b))
    return PAIR_GROUP_BASE + low * MAX_RANKS + high


def stage_group_key(stage: int) -> int:
    """The collective group of stage ``stage`` across the pipeline replicas."""
    return STAGE_GROUP_BASE + stage


def replica_group_key(replica: int) -> int:
    """The collective group of the K stages of pipeline replica ``replica``."""
    return REPLICA_GROUP_BASE + replica


def instance_key(kind: int, micro_batch: int = 0, index: int = 0, phase: int = TRAIN) -> int:
    """The instance key of tensor ``index`` of a ``kind`` transfer for ``micro_batch``."""
    return phase << 27 | kind << 24 | micro_batch << 12 | index


@dataclasses.dataclass(frozen=True)
class Link:
    """The channel between this rank and ``peer``.

    Attributes:
        rank: This process's rank.
        peer: The other process's rank.
        timeout: Seconds each transfer may wait for the peer (0: forever).
    """

    rank: int
    peer: int
    timeout: float = 0.0

    @property
    def group_key(self) -> int:
        return pair_group_key(self.rank, self.peer)

    def send(self, tensor: Any, kind: int, micro_batch: int = 0, index: int = 0,
             phase: int = TRAIN) -> tf.Tensor:
        """Sends ``tensor`` to the peer; tie the result to the step's outputs."""
        return group_broadcast(tensor, None, tensor.dtype, group_size=2,
                               group_key=self.group_key,
                               instance=instance_key(kind, micro_batch, index, phase),
                               timeout=self.timeout)

    def recv(self, shape: Any, dtype: tf.DType, kind: int, micro_batch: int = 0,
             index: int = 0, phase: int = TRAIN) -> tf.Tensor:
        """Receives the tensor the peer sends with the same kind, micro-batch, index, phase."""
        return group_broadcast(None, shape, dtype, group_size=2, group_key=self.group_key,
                               instance=instance_key(kind, micro_batch, index, phase),
                               timeout=self.timeout)


def group_broadcast(value: Any | None, shape: Any, dtype: Any, *, group_size: int,
                    group_key: int, instance: int, timeout: float = 0.0) -> tf.Tensor:
    """``value`` from the one member that passes it to every member of the group.

    The source passes ``value`` (and gets it back); the others pass None, with the ``shape``
    (a tensor is fine) and ``dtype`` they expect.
    """
    if value is not None:
        return collective_ops.broadcast_send_v2(
            value, group_size=group_size, group_key=group_key, instance_key=instance,
            timeout=timeout)
    return collective_ops.broadcast_recv_v2(
        shape, dtype, group_size=group_size, group_key=group_key, instance_key=instance,
        timeout=timeout)


def all_reduce_mean(tensors: Sequence[Any], *, group_size: int, group_key: int,
                    kind: int = REDUCE, phase: int = TRAIN, timeout: float = 0.0) -> list[Any]:
    """The element-wise mean of each tensor over the ``group_size`` members of the group."""
    if group_size == 1:
        return list(tensors)
    return [
        collective_ops.all_reduce_v2(
            t, group_size=group_size, group_key=group_key,
            instance_key=instance_key(kind, 0, i, phase), merge_op="Add", final_op="Id",
            timeout=timeout) / group_size
        for i, t in enumerate(tensors)
    ]


def exit_barrier(processes: int, timeout: float = 60.0) -> bool:
    """Waits (at most ``timeout`` s) until every process of the job reached its exit.

    Task 0 leads the resolution of every collective instance: were it to exit while another
    replica still ran its last steps (predict after fit, on a loaded machine), that replica's
    next transfer would fail with "Socket closed". Returns whether all arrived; never raises,
    since it runs at interpreter exit.
    """
    if processes < 2:
        return True
    try:
        all_reduce_mean([tf.constant(1.0)], group_size=processes, group_key=WORLD_GROUP_KEY,
                        kind=EXIT, timeout=timeout)
        return True
    except Exception:  # noqa: BLE001 - a peer that died or timed out: nothing left to wait for
        return False


def enable_collectives(cluster: ClusterSpec, task: Task) -> None:
    """Starts this task's TF server and enables collective ops across ``cluster``, once.

    What `tf.distribute.MultiWorkerMirroredStrategy` does at creation (group leader
    ``worker:0``, a coordination service, the server), without its all-replica semantics.
    Blocks until every task of the cluster has started.
    """
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.core.protobuf import tensorflow_server_pb2
    from tensorflow.python.eager import context

    ctx = context.context()
    leader = f"/job:{cluster.tasks()[0].type}/replica:0/task:0"
    ctx.configure_collective_ops(
        collective_leader=leader, scoped_allocator_enabled_ops=("CollectiveReduce",),
        device_filters=(f"/job:{task.type}/task:{task.index}",))
    jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=len(addresses))
            for job, addresses in cluster.as_dict().items()]
    ctx.configure_coordination_service(
        service_type="standalone", service_leader=leader, coordinated_jobs=jobs)
    config = ctx.config
    config.experimental.collective_group_leader = leader
    server_def = tensorflow_server_pb2.ServerDef(
        cluster=tf.train.ClusterSpec(cluster.as_dict()).as_cluster_def(),
        default_session_config=config, job_name=task.type, task_index=task.index,
        protocol="grpc")
    ctx.enable_collective_ops(server_def)
    ctx.ensure_initialized()
