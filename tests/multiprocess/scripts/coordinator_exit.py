"""One process holding a whole parameter-server cluster (TensorFlow's in-process pattern): the
coordinator schedules closures and leaves the last ones running, then prints as one JSON line
the coordinator threads alive before and after `tfdist.startup_hook.stop_coordinator_threads`."""

import json
import socket

import tensorflow as tf

from tfdist.startup_hook import COORDINATOR_THREADS, stop_coordinator_threads


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


cluster = tf.train.ClusterSpec({"worker": [f"localhost:{free_port()}"],
                                "ps": [f"localhost:{free_port()}"],
                                "chief": [f"localhost:{free_port()}"]})
servers = [tf.distribute.Server(cluster, job_name=job, task_index=0, protocol="grpc", start=True)
           for job in ("worker", "ps")]
resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
    cluster, task_type="chief", task_id=0, rpc_layer="grpc")
strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    total = tf.Variable(0.0)


@tf.function
def add_one():
    total.assign_add(1.0)
    return total.read_value()


for _ in range(20):
    coordinator.schedule(add_one)


def alive() -> list[str]:
    import threading
    return sorted(t.name for t in threading.enumerate() if t.name.startswith(COORDINATOR_THREADS))


before = alive()
left = stop_coordinator_threads(timeout_s=30.0)
print(json.dumps({"before": before, "left": left, "after": alive()}), flush=True)
