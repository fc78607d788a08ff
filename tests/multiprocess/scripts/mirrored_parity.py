"""Mirrored on 2 logical CPUs: train, then report each replica's weights and the references.

Run as ``python mirrored_parity.py`` with TF_USE_LEGACY_KERAS set (tf-keras) or not (Keras 3).
"""

from __future__ import annotations

import numpy as np
import parity_lib
import tensorflow as tf

import tfdist.strategies
from tfdist.core import flavour
from tfdist.testing import report

PER_REPLICA, STEPS = 4, 5

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
)
keras = flavour.get_keras()
strategy = tfdist.strategies.get_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])
global_batch = strategy.global_batch_size(PER_REPLICA)
x, y = parity_lib.make_data(global_batch * STEPS)


def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    # One pipeline feeds both replicas: replica 0 takes batch 2k, replica 1 batch 2k+1.
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(ctx.get_per_replica_batch_size(
        global_batch))


with strategy.scope():
    model = parity_lib.build_model(keras)
initial = model.get_weights()
model.fit(strategy.distribute_dataset(dataset_fn), epochs=1, steps_per_epoch=STEPS, verbose=0)


def tf_variable(var):  # Keras 3 wraps the tf.Variable (here a MirroredVariable) in .value
    return var.value if hasattr(var, "value") and not isinstance(var, tf.Variable) else var


replicas = [
    [np.asarray(v).tolist() for v in strategy.experimental_local_results(tf_variable(var))]
    for var in model.weights
]
report({
    "flavour": flavour.keras_flavour(),
    "num_replicas": strategy.num_replicas_in_sync,
    "variable_types": sorted({type(tf_variable(v)).__name__ for v in model.weights}),
    "initial": parity_lib.as_lists(initial),
    "replicas": replicas,  # [variable][replica] -> values
    "reference": parity_lib.as_lists(
        parity_lib.reference_weights(keras, initial, x, y, global_batch)),
    "half_batch": parity_lib.as_lists(
        parity_lib.half_batch_weights(keras, initial, x, y, PER_REPLICA)),
})
