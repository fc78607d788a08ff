"""The job's collective runtime: start it, join it within a deadline, leave it together.

`enable_collectives` starts this task's TF server and TensorFlow's collective ops across the
cluster (what ``MultiWorkerMirroredStrategy`` does at creation, without its all-replica
semantics); `join` does that inside the caller's start-up deadline and, once per process, makes
a normal exit wait for every process of the job (`exit_barrier`): task 0 leads the resolution of
every collective instance, and were it to exit while another process still ran its last steps,
that process's next transfer would fail with "Socket closed".

Example:
    >>> from tfdist.parallel.mesh import world_group
    >>> exit_barrier(world_group(1, rank=0))   # a job of one: nobody to wait for
    True
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import sys
from typing import Any

import tensorflow as tf

from tfdist.cluster import ClusterSpec, Task
from tfdist.parallel.keys import EXIT
from tfdist.parallel.mesh import ProcessGroup
from tfdist.parallel.ops import all_reduce_mean

__all__ = ["EXIT_KEY", "announce", "announced", "enable_collectives", "exit_barrier", "join"]

EXIT_KEY = "tfdist/exit/{rank}"
"""Set in the coordination service by each process at its exit (a normal one or not), so that a
process waiting for it in a rendezvous (`tfdist.strategies.model_parallel`'s ``save_model``)
stops waiting at once."""


def enable_collectives(cluster: ClusterSpec, task: Task) -> None:
    """Starts this task's TF server and enables collective ops across ``cluster``, once.

    Group leader ``worker:0`` (the cluster's first task), a coordination service, the server.
    Blocks until every task of the cluster has started: `join` puts a deadline on it.
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


def exit_barrier(world: ProcessGroup, timeout: float = 60.0) -> bool:
    """Waits (at most ``timeout`` s) until every process of ``world`` (the whole job) reached
    its exit. Returns whether all arrived; never raises, since it runs at interpreter exit."""
    if world.size < 2:
        return True
    try:
        all_reduce_mean([tf.constant(1.0)], group=world, kind=EXIT, timeout=timeout)
        return True
    except Exception:  # noqa: BLE001 - a peer that died or timed out: nothing left to wait for
        return False


def join(cluster: ClusterSpec, task: Task, world: ProcessGroup,
         deadline: contextlib.AbstractContextManager[Any] | None = None) -> None:
    """Joins the job's collective runtime inside ``deadline`` (the caller's start-up guard,
    e.g. `tfdist.strategies.startup.startup_deadline`; None: no deadline) and, at a normal
    exit, waits for every process of ``world`` (`exit_barrier`, registered once per process).
    """
    with deadline or contextlib.nullcontext():
        enable_collectives(cluster, task)
    _wait_for_every_process_at_exit(world)


def announce(key: str) -> None:
    """Sets ``key`` in the job's coordination service (a key-value store on task 0)."""
    from tensorflow.python.eager import context

    try:
        context.context().set_config_key_value(key, "1")
    except Exception:  # noqa: BLE001 - at exit, with the service gone: nothing to tell
        pass


def announced(key: str, wait_ms: int) -> bool:
    """Whether ``key`` is set in the coordination service (waiting up to ``wait_ms`` ms)."""
    from tensorflow.python.eager import context

    try:
        context.context().get_config_key_value(key, max(1, wait_ms))
        return True
    except Exception:  # noqa: BLE001 - not set within the wait (DeadlineExceeded, NotFound)
        return False


@functools.cache  # once per process, like enable_collectives: one barrier, one instance key
def _wait_for_every_process_at_exit(world: ProcessGroup) -> None:
    """At exit, says so (`EXIT_KEY`), then, at a normal exit, `exit_barrier`; not after an
    uncaught exception (the launcher should hear of a failure at once, not after the
    barrier's timeout)."""
    failed = []
    previous_hook = sys.excepthook

    def record_failure(*exc_info: Any) -> None:
        failed.append(exc_info[0])
        previous_hook(*exc_info)

    def at_exit() -> None:
        announce(EXIT_KEY.format(rank=world.rank))
        if not failed:
            exit_barrier(world)

    sys.excepthook = record_failure
    atexit.register(at_exit)
