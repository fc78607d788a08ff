"""A ParameterServer script written as TensorFlow's guide writes it (no tfdist inside).

Every task sets ``GRPC_FAIL_FAST=use_caller`` (the guide's advice for fault tolerance); worker and
ps tasks start their own ``tf.distribute.Server`` and join it. The chief fits ``y = 3x + 1`` with
SGD, one scheduled step at a time through a ``ClusterCoordinator``, and reports the weights; with
one worker the steps run in order, so they equal the same steps run in this process. Each task
reports what it ran (``TFDIST_RESULT_DIR``, read by the test).
"""

import json
import os
import sys

os.environ["GRPC_FAIL_FAST"] = "use_caller"

import tensorflow as tf  # noqa: E402

STEPS = 12
LEARNING_RATE = 0.1


def report(task: str, result: dict) -> None:
    path = os.path.join(os.environ["TFDIST_RESULT_DIR"], task.replace(":", "_") + ".json")
    with open(path + ".tmp", "w") as file:
        json.dump(result, file)
    os.replace(path + ".tmp", path)


def sgd_steps(w: tf.Variable, b: tf.Variable, steps) -> None:
    x = tf.constant([[0.0], [1.0], [2.0], [3.0]])
    y = 3.0 * x + 1.0
    for _ in steps:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(x * w + b - y))
        dw, db = tape.gradient(loss, [w, b])
        w.assign_sub(LEARNING_RATE * dw)
        b.assign_sub(LEARNING_RATE * db)


resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
task = f"{resolver.task_type}:{resolver.task_id}"
if resolver.task_type in ("worker", "ps"):
    report(task, {"ran": "script", "grpc_fail_fast": os.environ["GRPC_FAIL_FAST"]})
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id,
                                  protocol=resolver.rpc_layer or "grpc", start=True)
    server.join()
    sys.exit(0)

strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    w, b = tf.Variable([[0.0]]), tf.Variable([0.0])


@tf.function
def step():
    sgd_steps(w, b, range(1))
    return tf.constant(0)


for _ in range(STEPS):
    coordinator.schedule(step)
    coordinator.join()  # one step at a time: the order of a local run
local_w, local_b = tf.Variable([[0.0]]), tf.Variable([0.0])
sgd_steps(local_w, local_b, range(STEPS))
report(task, {"ran": "script", "grpc_fail_fast": os.environ["GRPC_FAIL_FAST"],
              "weights": [float(w.numpy()[0, 0]), float(b.numpy()[0])],
              "local_weights": [float(local_w.numpy()[0, 0]), float(local_b.numpy()[0])],
              "variable_device": w.device})
