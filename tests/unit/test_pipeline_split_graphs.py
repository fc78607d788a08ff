"""Functional graphs split into stages, in one process: nested models flattened, several inputs,
layers shared across stages, models that build state in their constructor, custom layers that
are not registered, and keras.applications models (split and built)."""

from __future__ import annotations

import numpy as np
import pytest

from tfdist.core import flavour
from tfdist.errors import StrategyConfigError
from tfdist.pipeline import graph, stage, tied

pytestmark = pytest.mark.unit

keras = flavour.get_keras()


def run_stages(spec, bounds, whole, x):
    """The stages built from ``spec`` with ``whole``'s weights, run one after the other."""
    values = x
    for k in range(len(bounds) - 1):
        part = stage.build_stage(spec, bounds, k)
        stage.set_layer_weights(part, spec, stage.stage_layers(spec, bounds, k),
                                stage.stage_weights(whole, spec, bounds, k))
        values = part(list(values))
        values = values if isinstance(values, list) else [values]
    return values[0]


def nested_blocks():
    x = keras.Input((4,), name="x")
    h = keras.layers.Dense(6, name="d0")(x)
    for i in range(2):
        inner = keras.Input((6,))
        a = keras.layers.Dense(6, activation="tanh", name=f"b{i}_a")(inner)
        block = keras.Model(inner, keras.layers.Add(name=f"b{i}_add")([inner, a]), name=f"b{i}")
        h = block(h)
    return keras.Model(x, keras.layers.Dense(1, name="out")(h), name="nested")


def test_nested_functional_blocks_are_flattened_and_split_inside():
    whole = nested_blocks()
    spec, bounds = stage.split_model(whole, stages=3, split_points=["b0_add", "b1_a"])
    assert spec.names == ("d0", "b0_a", "b0_add", "b1_a", "b1_add", "out")
    # The first cut is inside block 0: it carries the block's input (its skip) and b0_a's output.
    assert spec.cuts(bounds) == ((1, 2), (3,))
    x = np.random.default_rng(0).normal(size=(3, 4)).astype("float32")
    np.testing.assert_allclose(run_stages(spec, bounds, whole, [x]), whole(x), atol=1e-6)


def test_a_model_with_two_inputs_is_split_and_its_integer_input_has_no_gradient():
    ids = keras.Input((3,), dtype="int32", name="ids")
    scale = keras.Input((1,), name="scale")
    e = keras.layers.Flatten(name="flat")(keras.layers.Embedding(5, 2, name="emb")(ids))
    h = keras.layers.Dense(4, name="d")(keras.layers.Concatenate(name="cat")([e, scale]))
    out = keras.layers.Dense(1, name="out")(keras.layers.Multiply(name="mul")([h, scale]))
    whole = keras.Model([ids, scale], out)
    spec, bounds = stage.split_model(whole, stages=2, split_points=["flat"])
    assert spec.input_names == ("ids", "scale") and spec.inputs == (0, 1)
    (cut,) = spec.cuts(bounds)
    assert [(b.dtype, b.gradient) for b in spec.boundary(cut)] == [
        ("float32", False), ("float32", True)]  # scale (a model input), emb's output
    x = [np.array([[1, 2, 3], [4, 0, 1]], "int32"), np.array([[0.5], [2.0]], "float32")]
    np.testing.assert_allclose(run_stages(spec, bounds, whole, x), whole(x), atol=1e-6)


def test_a_subclassed_model_is_refused_with_the_fix_for_it():
    class Net(keras.Model):
        def call(self, x):
            return x

    with pytest.raises(StrategyConfigError) as info:
        stage.describe_model(Net())
    message = str(info.value)
    assert "splits a model by its graph of layers; a subclassed Net" in message
    assert "Fix: build the same layers with the functional API" in message


def test_a_layer_called_in_two_stages_is_held_by_both_and_owned_by_the_first():
    x = keras.Input((3,))
    shared = keras.layers.Dense(3, name="shared")
    out = shared(keras.layers.Dense(3, name="mid")(shared(x)))
    whole = keras.Model(x, out)
    spec, bounds = stage.split_model(whole, stages=2, split_points=["mid"])
    assert tied.shared_layers(spec, bounds) == {0: (0, 1)}
    assert stage.stage_layers(spec, bounds, 1) == (1, 0)
    assert stage.owned_layers(spec, bounds, 1) == (1,)
    x = np.ones((2, 3), "float32")
    np.testing.assert_allclose(run_stages(spec, bounds, whole, [x]), whole(x), atol=1e-6)


def test_global_clipnorm_with_a_weight_tied_across_stages_is_refused_naming_it():
    x = keras.Input((3,))
    shared = keras.layers.Dense(3, name="shared")
    whole = keras.Model(x, shared(keras.layers.Dense(3, name="mid")(shared(x))))
    spec, bounds = stage.split_model(whole, stages=2, split_points=["mid"])
    with pytest.raises(StrategyConfigError) as info:
        tied.check_clipping(keras.optimizers.Adam(global_clipnorm=1.0), spec, bounds)
    message = str(info.value)
    assert "global_clipnorm=1.0 with ['shared']" in message and "use clipnorm" in message
    tied.check_clipping(keras.optimizers.Adam(clipnorm=1.0), spec, bounds)  # per variable: exact
    untied, untied_bounds = stage.split_model(
        keras.Sequential([keras.Input((3,)), keras.layers.Dense(3, name="a"),
                          keras.layers.Dense(3, name="b")]), stages=2, split_points=["b"])
    tied.check_clipping(keras.optimizers.Adam(global_clipnorm=1.0), untied, untied_bounds)


def compiles_itself():
    x = keras.Input((3,))
    h = keras.layers.Dropout(0.1, seed=1, name="drop")(keras.layers.Dense(8, name="a")(x))
    model = keras.Model(x, keras.layers.Dense(1, name="b")(h))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    if flavour.keras_flavour() == "keras3":
        model.seed = keras.random.SeedGenerator(3)
    return model


def test_a_model_that_builds_state_in_its_constructor_is_described_without_weights():
    spec, bounds = stage.split_model(compiles_itself, stages=2, split_points=["b"])
    assert spec.names == ("a", "drop", "b") and spec.params == (32, 0, 9)
    part = stage.build_stage(spec, bounds, 1)
    assert [tuple(w.shape) for w in part.weights] == [(8, 1), (1,)]


class Scale(keras.layers.Layer):
    """Not registered as serializable."""

    def __init__(self, factor=2.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x):
        return x * self.factor

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}


class Factor:
    """A plain object: no config can carry it."""

    def __init__(self, value):
        self.value = value


class Forgets(keras.layers.Layer):
    """Its config cannot carry a constructor argument."""

    def __init__(self, factor, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x):
        return x * self.factor.value


def with_layer(layer):
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, name="d"), layer,
                             keras.layers.Dense(1, name="out")])


def test_an_unregistered_custom_layer_is_rebuilt_from_its_live_class():
    whole = with_layer(Scale(3.0, name="scale"))
    spec, bounds = stage.split_model(whole, stages=2, split_points=["scale"])
    x = np.ones((2, 2), "float32")
    np.testing.assert_allclose(run_stages(spec, bounds, whole, [x]), whole(x), atol=1e-6)


def test_a_custom_layer_its_config_cannot_rebuild_is_refused_up_front():
    with pytest.raises(StrategyConfigError) as info:
        stage.split_model(with_layer(Forgets(Factor(3.0), name="forgets")), stages=2)
    message = str(info.value)
    assert "Layer 'forgets' (Forgets) cannot be rebuilt from its config" in message
    assert "keras.saving.register_keras_serializable" in message


def test_graph_read_lists_calls_after_their_inputs():
    whole = nested_blocks()
    read = graph.read_graph(whole)
    made = set(read.inputs)
    for node in read.nodes:
        assert set(node.inputs) <= made
        made |= set(node.outputs)
    assert set(read.outputs) <= made


def test_a_nested_model_called_on_a_dict_gets_each_input_by_its_key():
    # A KerasHub task model calls its backbone on {"token_ids", "padding_mask"}; Keras orders a
    # dict's inputs by sorted key. Matched by call order instead, the flattened model fed the
    # padding mask as the token ids (same shape and dtype: silently wrong).
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    mask = keras.Input((None,), dtype="int32", name="padding_mask")
    embedded = keras.layers.Embedding(10, 3, name="emb")(ids)
    scaled = keras.layers.Multiply(name="masked")([embedded, keras.ops.expand_dims(
        keras.ops.cast(mask, "float32"), -1)])
    inner = keras.Model({"token_ids": ids, "padding_mask": mask}, scaled, name="backbone")
    outer_ids = keras.Input((None,), dtype="int32", name="token_ids")
    outer_mask = keras.Input((None,), dtype="int32", name="padding_mask")
    out = keras.layers.Dense(1, name="head")(inner({"token_ids": outer_ids,
                                                    "padding_mask": outer_mask}))
    model = keras.Model({"token_ids": outer_ids, "padding_mask": outer_mask}, out)
    x = {"token_ids": np.array([[3, 4, 5]], "int32"), "padding_mask": np.array([[1, 1, 0]],
                                                                                 "int32")}
    whole = stage.assemble(stage.describe_model(model), stage.stage_weights(
        model, stage.describe_model(model), (0, len(stage.describe_model(model).nodes)), 0))
    np.testing.assert_array_equal(whole(x), model(x))


def test_a_cut_may_carry_tensors_of_unknown_length():
    # (was refused: "needs static shapes"); each transfer now carries its batch's lengths
    model = keras.Sequential([keras.Input((None, 3)), keras.layers.Dense(2, name="a"),
                              keras.layers.Dense(1, name="b")])
    spec, bounds = stage.split_model(model, stages=2)
    (cut,) = [spec.boundary(tensors) for tensors in spec.cuts(bounds)]
    assert [(b.shape, b.unknown, b.gradient) for b in cut] == [((None, 2), (0,), True)]
    second = stage.build_stage(spec, bounds, 1)
    assert second.inputs[0].shape == (None, None, 2)
