"""The pipeline's loss: a Keras Loss object is reduced to the mean that compile's loss reports,
in both Kerases, and also inside a distribution strategy (where tf-keras refuses its own
default reduction)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfdist.pipeline.loss_and_metrics import mean_loss

pytestmark = pytest.mark.unit

Y = np.array([0, 2, 1, 2])
LOGITS = np.array([[2.0, 0.1, -1.0], [0.3, 0.2, 1.5], [0.0, 1.0, 0.0], [1.0, 1.0, 1.0]],
                  dtype="float32")


@pytest.mark.parametrize("module", ["keras", "tf_keras"])
def test_loss_object_gives_the_batch_mean_inside_a_strategy(module):
    keras = pytest.importorskip(module)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    expected = float(loss(Y, LOGITS))               # outside any strategy: the batch mean
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        got = float(tf.distribute.get_strategy().run(
            lambda: mean_loss(loss)(tf.constant(Y), tf.constant(LOGITS))))
    assert got == pytest.approx(expected, rel=1e-6)
    assert float(mean_loss(keras.losses.get("mse"))(LOGITS, LOGITS * 0)) == pytest.approx(
        float(np.mean(LOGITS ** 2)), rel=1e-6)
