"""A process with one replica on its CPU reads its distributed input with a plain iterator
(`tfdist.strategies.input.HOST_INPUT`): the same batches as TensorFlow's own iteration, and no
function traced for each new iterator (each epoch of ``fit``, each ``evaluate``)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import func_graph

import tfdist.strategies
from tfdist.strategies.input import HOST_INPUT, feeds_its_host_device


@pytest.fixture
def traces(monkeypatch):
    """The number of graphs TensorFlow has built (functions traced) since the fixture was set up."""
    count = [0]
    build = func_graph.func_graph_from_py_func

    def counted(*args, **kwargs):
        count[0] += 1
        return build(*args, **kwargs)

    monkeypatch.setattr(func_graph, "func_graph_from_py_func", counted)
    return count


def _batches(distributed):
    return [batch.numpy().tolist() for batch in distributed]


def test_both_ways_of_distributing_read_the_same_batches_with_a_plain_iterator():
    strategy = tfdist.strategies.get_strategy("default")
    dataset = tf.data.Dataset.range(10).batch(4)
    distributed = strategy.experimental_distribute_dataset(dataset)
    from_fn = strategy.distribute_datasets_from_function(lambda _: dataset)
    assert feeds_its_host_device(strategy)
    assert distributed._options is HOST_INPUT and from_fn._options is HOST_INPUT
    assert _batches(distributed) == _batches(from_fn) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    worker_iterator = iter(distributed)._iterators[0]._iterator
    assert type(worker_iterator).__name__ == "OwnedIterator"


def test_options_a_caller_passes_are_kept():
    strategy = tfdist.strategies.get_strategy("default")
    options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
    distributed = strategy.experimental_distribute_dataset(tf.data.Dataset.range(4).batch(2),
                                                           options)
    assert distributed._options is options
    assert type(iter(distributed)._iterators[0]._iterator).__name__ == "OwnedMultiDeviceIterator"


def test_epochs_after_the_first_trace_what_keras_alone_traces_and_train_the_same(traces):
    """Without `HOST_INPUT` the later 3 epochs and evaluation built 60 graphs more than Keras
    with no strategy (six for each iterator); with it, the same 6 (Keras's input pipeline)."""
    keras = pytest.importorskip("keras")
    x = np.random.default_rng(0).random((64, 5), dtype=np.float32)
    y = (x.sum(axis=1) > 2.5).astype("int32")

    def trained(scope):
        keras.utils.set_random_seed(1)
        with scope:
            model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
            model.compile(optimizer=keras.optimizers.Adam(0.01),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        model.evaluate(x, y, batch_size=16, verbose=0)
        before = traces[0]
        model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
        model.evaluate(x, y, batch_size=16, verbose=0)
        return traces[0] - before, model.get_weights()

    strategy = tfdist.strategies.get_strategy("default")
    later_traces, weights = trained(strategy.scope())
    keras_traces, plain = trained(tf.distribute.get_strategy().scope())
    assert later_traces == keras_traces <= 6
    for got, want in zip(weights, plain, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
