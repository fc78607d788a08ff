"""Initial weights as one process draws them (`tfdist.pipeline.initial`), in one process: a model
built without weights keeps each weight's initializer with the seed a one-process build gives it,
so drawing the weights later, one at a time, whole or in slices, gives exactly the one-process
values, in Keras 3 and tf-keras, a Dropout's draw from the stream included; what cannot be
replayed is named; a stage built from the pipeline's description gets its part; a fresh stream
(the sabotage the multi-process tests use) does not."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

from tfdist.compat import models as keras_compat
from tfdist.core import flavour
from tfdist.parallel.mesh import Mesh
from tfdist.pipeline import initial, stage

pytestmark = pytest.mark.unit

SEED = 3


def build(keras, initializer="glorot_uniform"):
    """Every kind of weight the strategies split, a Dropout (no weight, a seed from the stream)
    between them, seeded inside as a user's build function would be."""
    keras.utils.set_random_seed(SEED)
    tokens = keras.Input((4,), dtype="int32")
    x = keras.layers.Embedding(10, 8, name="emb")(tokens)
    x = keras.layers.Dropout(0.1, name="drop")(x)
    x = keras.layers.MultiHeadAttention(2, 4, name="attn")(x, x)
    x = keras.layers.LayerNormalization(name="norm")(x)
    x = keras.layers.Dense(6, name="up", kernel_initializer=initializer,
                           bias_initializer="random_normal")(x)
    return keras.Model(tokens, keras.layers.Dense(3, name="out")(x), name="small")


def recorded(keras, flavour_name=None, initializer="glorot_uniform"):
    with keras_compat.abstract_build(flavour_name):
        model = build(keras, initializer)
        return {layer.name: initial.record(layer) for layer in model.layers}


def gaps(draws, one):
    """Each layer's largest gap between its draws and the one-process model ``one``."""
    return {name: max(float(np.max(np.abs(np.asarray(initial.draw(d)) - w)))
                      for d, w in zip(found, one.get_layer(name).get_weights(), strict=True))
            for name, found in draws.items() if found}


def test_the_doctests_run():
    assert doctest.testmod(initial).failed == 0


@pytest.mark.parametrize("name", ["keras3", "tf_keras"])
def test_recorded_draws_replay_one_process_build_exactly(name):
    keras = flavour.get_keras(name)
    draws = recorded(keras, name)
    assert {k for k, v in draws.items() if v} == {"emb", "attn", "norm", "up", "out"}
    assert len(draws["attn"]) == 8 and all(d.note is None for v in draws.values() for d in v)
    one = build(keras)
    assert max(gaps(draws, one).values()) == 0.0
    # a slice of the whole draw is that slice of the one-process weight
    kernel = np.asarray(initial.draw(draws["up"][0], axis=1, index=1, parts=2))
    assert np.array_equal(kernel, one.get_layer("up").get_weights()[0][:, 3:])


def test_a_stage_built_from_the_description_gets_its_part():
    keras = flavour.get_keras()
    spec, bounds = stage.split_model(lambda: build(keras), 2, split_points=["norm"])
    second = stage.build_stage(spec, bounds, 1)  # its own initializers: other seeds
    one = build(keras)
    before = np.abs(second.get_layer("up").get_weights()[0] - one.get_layer("up").kernel).max()
    assert before > 0.01
    initial.initialise_layers(second, {layer.name: layer.draws for layer in spec.layers})
    for name in ("norm", "up", "out"):
        for ours, theirs in zip(second.get_layer(name).get_weights(),
                                one.get_layer(name).get_weights(), strict=True):
            assert np.array_equal(ours, theirs), name


def test_a_built_model_records_nothing():
    keras = flavour.get_keras()
    assert initial.record(build(keras).get_layer("up")) == ()


class Halves:
    """Not a Keras initializer."""

    def __call__(self, shape, dtype=None):
        return np.full(shape, 0.5, "float32")


def test_initializers_that_cannot_be_replayed_are_named_and_keep_their_values():
    keras = flavour.get_keras()
    seeded_by_a_generator = keras.initializers.GlorotUniform(keras.random.SeedGenerator(1))
    assert "SeedGenerator" in initial.why_not(seeded_by_a_generator)
    assert "not a Keras initializer" in initial.why_not(Halves())
    assert initial.why_not(keras.initializers.Zeros()) is None
    assert initial.why_not(keras.initializers.GlorotUniform(seed=4)) is None
    draws = recorded(keras, initializer=Halves())
    assert initial.notes(draws) == [
        "initial weights: layer 'up' weight 0: Halves is not a Keras initializer (its draws "
        "cannot be replayed)"]
    variables = [keras.Variable(np.full(w.shape, 7.0, "float32")) for w in draws["up"]]
    initial.initialise(variables, draws["up"])  # whole, no group: kept as they are
    assert float(variables[0].numpy().min()) == 7.0
    assert not np.any(variables[1].numpy() == 7.0)  # the replayable bias drawn


def test_seeds_agree_alone_and_a_fresh_stream_draws_other_weights(monkeypatch):
    keras = flavour.get_keras()
    one = build(keras)
    alone = Mesh().world(0)
    draws = recorded(keras)
    initial.agree_seeds([d for v in draws.values() for d in v], alone)
    assert max(gaps(draws, one).values()) == 0.0
    monkeypatch.setenv(initial.SABOTAGE_ENV, "0")  # this process (rank 0) draws fresh seeds
    initial.agree_seeds([d for v in draws.values() for d in v], alone)
    assert gaps(draws, one)["up"] > 0.01
