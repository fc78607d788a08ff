"""The vocabulary-parallel cross entropy's pick of the target logit (`tfdist.tensor.loss`):
the same values and gradients as numpy's ``take_along_axis``, and in a group of one the loss
and its gradient are Keras's sparse categorical cross entropy from logits."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tfdist.parallel.mesh import Mesh
from tfdist.tensor import loss


def _value_and_gradient(fn, values, *args):
    values = tf.constant(values)
    with tf.GradientTape() as tape:
        tape.watch(values)
        out = fn(values, *args)
        total = tf.reduce_sum(out * tf.random.stateless_normal(tf.shape(out), (1, 2)))
    return out.numpy(), tape.gradient(total, values).numpy()


def test_the_pick_is_take_along_axis_bit_for_bit_values_and_gradients():
    rng = np.random.default_rng(0)
    values = rng.normal(size=(3, 5, 7)).astype("float32")
    index = rng.integers(0, 7, (3, 5)).astype("int32")

    def numpy_pick(v, i):
        return tf.squeeze(tf.experimental.numpy.take_along_axis(v, i[..., None], axis=-1), -1)

    want = _value_and_gradient(numpy_pick, values, index)
    got = _value_and_gradient(loss._pick, values, index)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_in_a_group_of_one_the_loss_is_keras_sparse_cross_entropy():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 4, 9)).astype("float32") * 3
    labels = rng.integers(0, 9, (2, 4))
    split = loss.VocabParallelCrossEntropy(Mesh().group("tensor", 0), start=0)
    keras_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for y in (labels, labels[..., None]):  # (..., 1) labels too
        got = _value_and_gradient(lambda v, t: split(t, v)[None], logits, y)
        want = _value_and_gradient(lambda v, t: keras_loss(t, v)[None], logits, y)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-7)
