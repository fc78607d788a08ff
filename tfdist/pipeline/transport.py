"""Tensors between processes over TensorFlow's collective runtime: send/recv and group all-reduce.

With collective ops enabled on every process of the job (`enable_collectives`), a broadcast in a
group of two (``broadcast_send_v2`` on one side, ``broadcast_recv_v2`` on the other) moves one
tensor from one process to the other. Every function here takes its group as a
`tfdist.mesh.ProcessGroup` (members, key, this process's rank), which the layout
hands out (`PipelineLayout.group`, `pair`, `world`); this module makes no group key itself. It
makes the instance keys, unique within a group:

``phase << 27 | kind << 24 | micro_batch << 12 | index``, ``kind`` one of `ACTIVATION`,
`GRADIENT`, `WEIGHTS`, `REDUCE`, `SHARE`, `METRICS`; ``index`` numbers the tensors of one
transfer (the tensors a cut carries, `BoundaryTensor`; the variables of a weight transfer or an
all-reduce); ``phase`` separates training,
evaluation, prediction and custom-loop steps (`TRAIN`, `EVALUATE`, `PREDICT`, `CUSTOM`), whose
tensors differ in shape: TensorFlow refuses one instance key used with two shapes.

Inside a ``tf.function`` an op whose output nothing uses is pruned: a pruned send leaves its
receiver waiting forever. Callers tie every send to the step's outputs
(``tf.control_dependencies``); `Link.send` returns the op's output for that.

Example:
    >>> instance_key(GRADIENT, micro_batch=1, index=0)
    33558528
    >>> from tfdist.mesh import pair_group
    >>> link = Link(pair_group(3, 2))
    >>> link.rank, link.peer, link.group.key
    (3, 2, 1056771)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from tensorflow.python.ops import collective_ops

from tfdist.cluster import ClusterSpec, Task
from tfdist.mesh import ProcessGroup

__all__ = [
    "ACTIVATION",
    "GRADIENT",
    "WEIGHTS",
    "REDUCE",
    "instance_key",
    "Link",
    "BoundaryTensor",
    "send_boundary",
    "recv_boundary",
    "group_broadcast",
    "all_reduce_mean",
    "enable_collectives",
]

ACTIVATION, GRADIENT, WEIGHTS, REDUCE, SHARE, METRICS = 1, 2, 3, 4, 5, 6
TIED = 0
"""The kind of the sums (and initial copies) of weights tied across stages
(`tfdist.pipeline.tied`), on the pair group of their two holders."""
TRAIN, EVALUATE, PREDICT, CUSTOM = 0, 1, 2, 3
EXIT = 7


def instance_key(kind: int, micro_batch: int = 0, index: int = 0, phase: int = TRAIN) -> int:
    """The instance key of tensor ``index`` of a ``kind`` transfer for ``micro_batch``."""
    return phase << 27 | kind << 24 | micro_batch << 12 | index


STOP_VOTE = instance_key(EXIT, micro_batch=1)
"""The instance key of the vote after each step on stopping for SIGTERM, on the world group
(`tfdist.pipeline.preemption`); `exit_barrier` uses micro-batch 0 of the same kind."""


@dataclasses.dataclass(frozen=True)
class Link:
    """The channel between this rank and its peer: a group of two.

    Attributes:
        group: The pair's group (`PipelineLayout.pair`).
        timeout: Seconds each transfer may wait for the peer (0: forever).
    """

    group: ProcessGroup
    timeout: float = 0.0

    @property
    def rank(self) -> int:
        return self.group.members[self.group.rank]

    @property
    def peer(self) -> int:
        return self.group.peer

    def send(self, tensor: Any, kind: int, micro_batch: int = 0, index: int = 0,
             phase: int = TRAIN) -> tf.Tensor:
        """Sends ``tensor`` to the peer; tie the result to the step's outputs."""
        return group_broadcast(tensor, None, tensor.dtype, group=self.group,
                               instance=instance_key(kind, micro_batch, index, phase),
                               timeout=self.timeout)

    def recv(self, shape: Any, dtype: tf.DType, kind: int, micro_batch: int = 0,
             index: int = 0, phase: int = TRAIN) -> tf.Tensor:
        """Receives the tensor the peer sends with the same kind, micro-batch, index, phase."""
        return group_broadcast(None, shape, dtype, group=self.group,
                               instance=instance_key(kind, micro_batch, index, phase),
                               timeout=self.timeout)


@dataclasses.dataclass(frozen=True)
class BoundaryTensor:
    """One tensor alive across a cut between stages (`tfdist.pipeline.partition.crossing`).

    A cut carries a tuple of them: tensor ``i`` travels as index ``i`` of each micro-batch's
    ``ACTIVATION`` transfer, and, when it has a ``gradient``, its gradient comes back as index
    ``i`` of the ``GRADIENT`` transfer.

    Attributes:
        shape: Its shape without the batch dimension.
        dtype: Its dtype name.
        gradient: Whether its gradient goes back: a floating tensor made by a layer (integer
            tensors, masks and the model's inputs travel forward only).

    Example:
        >>> BoundaryTensor((4,), "int32", gradient=False).nbytes
        16
    """

    shape: tuple[int, ...]
    dtype: str
    gradient: bool

    @property
    def nbytes(self) -> int:
        """Bytes per row."""
        size = tf.as_dtype(self.dtype).size
        for d in self.shape:
            size *= int(d)
        return size


def send_boundary(link: Any, tensors: Sequence[Any], boundary: Sequence[BoundaryTensor],
                  kind: int, micro_batch: int = 0, phase: int = TRAIN) -> list[Any]:
    """Sends a cut's tensors (``kind`` ACTIVATION: all; GRADIENT: those with a gradient, a
    None one as zeros); returns the sends, to tie to the step's outputs."""
    sends = []
    for i, (tensor, spec) in enumerate(zip(tensors, boundary, strict=True)):
        if kind == GRADIENT and not spec.gradient:
            continue
        sends.append(link.send(tensor, kind, micro_batch, index=i, phase=phase))
    return sends


def recv_boundary(link: Any, boundary: Sequence[BoundaryTensor], rows: Any, kind: int,
                  micro_batch: int = 0, phase: int = TRAIN) -> list[Any]:
    """Receives what `send_boundary` sends: ``kind`` ACTIVATION, every tensor of the cut;
    GRADIENT, a gradient per tensor that has one, None for the others."""
    received = []
    for i, spec in enumerate(boundary):
        if kind == GRADIENT and not spec.gradient:
            received.append(None)
            continue
        shape = tf.stack([rows, *[int(d) for d in spec.shape]])
        received.append(link.recv(shape, tf.as_dtype(spec.dtype), kind, micro_batch, index=i,
                                  phase=phase))
    return received


def group_broadcast(value: Any | None, shape: Any, dtype: Any, *, group: ProcessGroup,
                    instance: int, timeout: float = 0.0) -> tf.Tensor:
    """``value`` from the one member that passes it to every member of ``group``.

    The source passes ``value`` (and gets it back); the others pass None, with the ``shape``
    (a tensor is fine) and ``dtype`` they expect.
    """
    if value is not None:
        return collective_ops.broadcast_send_v2(
            value, group_size=group.size, group_key=group.key, instance_key=instance,
            timeout=timeout)
    return collective_ops.broadcast_recv_v2(
        shape, dtype, group_size=group.size, group_key=group.key, instance_key=instance,
        timeout=timeout)


def broadcast_variable(variable: Any, *, group: ProcessGroup, instance: int,
                       timeout: float = 0.0) -> None:
    """Gives ``variable`` on every member of ``group`` the value it has on group rank 0."""
    if group.size == 1:
        return
    first = group.rank == 0
    value = group_broadcast(tf.convert_to_tensor(variable) if first else None, variable.shape,
                            tf.as_dtype(variable.dtype), group=group, instance=instance,
                            timeout=timeout)
    if not first:
        variable.assign(value)


def all_reduce_mean(tensors: Sequence[Any], *, group: ProcessGroup, kind: int = REDUCE,
                    phase: int = TRAIN, timeout: float = 0.0) -> list[Any]:
    """The element-wise mean of each tensor over the members of ``group``."""
    if group.size == 1:
        return list(tensors)
    return [
        collective_ops.all_reduce_v2(
            t, group_size=group.size, group_key=group.key,
            instance_key=instance_key(kind, 0, i, phase), merge_op="Add", final_op="Id",
            timeout=timeout) / group.size
        for i, t in enumerate(tensors)
    ]


def all_reduce_sum(tensor: Any, *, group: ProcessGroup, instance: int,
                   timeout: float = 0.0) -> Any:
    """The element-wise sum of ``tensor`` over the members of ``group``."""
    if group.size == 1:
        return tensor
    return collective_ops.all_reduce_v2(
        tensor, group_size=group.size, group_key=group.key, instance_key=instance,
        merge_op="Add", final_op="Id", timeout=timeout)


def exit_barrier(world: ProcessGroup, timeout: float = 60.0) -> bool:
    """Waits (at most ``timeout`` s) until every process of ``world`` (the whole job,
    `PipelineLayout.world`) reached its exit.

    Task 0 leads the resolution of every collective instance: were it to exit while another
    replica still ran its last steps (predict after fit, on a loaded machine), that replica's
    next transfer would fail with "Socket closed". Returns whether all arrived; never raises,
    since it runs at interpreter exit.
    """
    if world.size < 2:
        return True
    try:
        all_reduce_mean([tf.constant(1.0)], group=world, kind=EXIT, timeout=timeout)
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
