"""ZeroEngine on a model whose gradients are all sparse (an Embedding and weightless layers):
no dense gradient means no reduce-scatter buffer, and TensorFlow's all-to-all crashes the process
on an empty one, so none is made (`tfdist.zero.pieces.owner_buffer` returns None); each
owner's row slices come out of the gathered slices. Real collectives on a group of one process
(D=1, in this process): the step's shapes, not the sharding, are what is checked."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_model_of_sparse_gradients_only_updates_without_an_all_to_all(stage):
    import keras
    import tensorflow as tf

    from tfdist.parallel.mesh import ProcessGroup
    from tfdist.zero.engine import ZeroEngine
    from tfdist.zero.pieces import owner_buffer

    model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(8, 2),
                              keras.layers.GlobalAveragePooling1D()])
    engine = ZeroEngine(model, stage, ProcessGroup(key=90 + stage, members=(0,), rank=0), 10.0)
    gradient = tf.IndexedSlices(tf.ones([3, 2]), tf.constant([0, 1, 1]), tf.constant([8, 2]))
    assert owner_buffer([gradient], engine.plan, set(), 1, tf.float32) is None
    (owned,) = engine.reduce_to_owners([gradient])
    assert isinstance(owned, tf.IndexedSlices)
    assert owned.indices.numpy().tolist() == [0, 1, 1]
    adam = keras.optimizers.Adam(0.1, global_clipnorm=1.0)
    engine.build_optimizer(adam)
    before = engine.gather_whole()[0].numpy()
    adam.apply_gradients(zip(engine.clip_pieces([owned], adam), engine.pieces, strict=True))
    after = engine.gather_whole()[0].numpy()
    assert np.abs(after[:2] - before[:2]).min() > 0.05  # rows 0 and 1 moved by about lr
    np.testing.assert_array_equal(after[2:], before[2:])  # the others did not
