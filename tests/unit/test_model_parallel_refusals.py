"""What tensor and pipeline would silently change, refused or made exact before training: a
step override, a constraint on a split weight."""

from __future__ import annotations

import keras
import pytest

from tfdist.errors import StrategyConfigError
from tfdist.strategies.pipeline import PipelineStrategy
from tfdist.strategies.tensor import TensorStrategy
from tfdist.tensor.rules import plan_model


class _OwnStep(keras.Model):
    """A model whose train_step adds to what Keras's does (both strategies once ignored it)."""

    def train_step(self, data):
        return super().train_step(data)


def _model(cls=keras.Model, constraint=None) -> keras.Model:
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu", name="up",
                                kernel_constraint=constraint)(inputs)
    hidden = keras.layers.Dense(8, name="down")(hidden)
    return cls(inputs, keras.layers.Dense(1, name="head")(hidden))


@pytest.mark.parametrize("strategy", [TensorStrategy, PipelineStrategy])
def test_a_train_step_override_is_refused_naming_it(strategy):
    for model_or_fn in (_model(_OwnStep), lambda: _model(_OwnStep)):
        with pytest.raises(StrategyConfigError) as refused:
            strategy().build_model(model_or_fn)
        message = str(refused.value)
        assert "_OwnStep.train_step would be silently ignored" in message
        assert "Fix: move what the override adds into layers" in message
    assert strategy().build_model(_model()) is not None  # Keras's own steps: accepted


def test_a_constrained_layer_is_kept_whole_and_the_plan_says_why():
    # MaxNorm on a split Dense pair was applied per shard (a weight gap of 0.334).
    kinds = {layer.name: layer.kind for layer in plan_model(
        _model(constraint=keras.constraints.MaxNorm(0.3)), 2).layers}
    assert kinds == {"up": "replicated", "down": "replicated", "head": "replicated"}
    table = plan_model(_model(constraint=keras.constraints.MaxNorm(0.3)), 2).table()
    assert "has a constraint (it would be applied to each shard, not the whole weight)" in table
    # An element-wise constraint is the same on a shard: the pair is still split.
    kinds = {layer.name: layer.kind for layer in plan_model(
        _model(constraint=keras.constraints.NonNeg()), 2).layers}
    assert (kinds["up"], kinds["down"]) == ("column", "row")
    with pytest.raises(StrategyConfigError, match=r"Layer 'up' cannot be split .*constraint"):
        plan_model(_model(constraint=keras.constraints.MaxNorm(0.3)), 2,
                   {"up": "column", "down": "row"})


@pytest.mark.parametrize("strategy", [TensorStrategy, PipelineStrategy])
def test_an_invalid_rule_pattern_is_refused_when_the_strategy_is_made(strategy):
    # it once surfaced as a bare re.error from inside build_model
    with pytest.raises(StrategyConfigError) as info:
        strategy(rules={"ffn_[": "replicated"})
    message = str(info.value)
    assert "Tensor rule 'ffn_[' is not a valid regular expression" in message
    assert "Fix: escape special characters (re.escape(name))" in message


class _Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1, name="dense")

    def call(self, x):
        return self.dense(x)


def _subclassed():
    model = _Subclassed()
    model(keras.ops.ones((1, 4)))
    return model


@pytest.mark.parametrize("strategy", [TensorStrategy, PipelineStrategy])
@pytest.mark.parametrize("as_function", [False, True])
def test_a_subclassed_model_is_refused_with_the_fix(strategy, as_function):
    # under tensor it once failed with AttributeError: '_Subclassed' object has no 'outputs'
    with pytest.raises(StrategyConfigError) as info:
        strategy().build_model(_subclassed if as_function else _subclassed())
    message = str(info.value)
    assert "splits a model by its graph of layers; a subclassed _Subclassed" in message
    assert "Fix: build the same layers with the functional API" in message


def test_a_two_output_model_is_refused_by_the_pipeline():
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, name="hidden")(inputs)
    model = keras.Model(inputs, [keras.layers.Dense(1, name="a")(hidden),
                                 keras.layers.Dense(1, name="b")(hidden)], name="two")
    with pytest.raises(StrategyConfigError) as info:
        PipelineStrategy().build_model(model)
    message = str(info.value)
    assert "trains a model of one output" in message and "'two' with 2 outputs" in message
    assert "Fix: concatenate the outputs into one" in message


@pytest.mark.parametrize("strategy_class", [TensorStrategy, PipelineStrategy])
def test_a_model_made_outside_build_model_is_refused_at_compile_and_fit(strategy_class):
    # Made outside every scope, then compiled in the strategy's scope, or fit on its input:
    # Keras would train it whole on every process, unsplit, and save_model could not
    # assemble it (it failed only after training).
    import numpy as np
    import tensorflow as tf

    import tfdist

    strategy = strategy_class()
    x, y = np.ones((8, 8), "float32"), np.ones((8, 1), "float32")
    outside = _model()
    with strategy.scope(), pytest.raises(StrategyConfigError) as refused:
        outside.compile(optimizer="adam", loss="mse")
    message = str(refused.value)
    assert "this one was made outside strategy.build_model, so model.compile would run all " \
           "of it on every process, unsplit" in message
    assert "Received: a Functional made outside any tfdist strategy's scope" in message
    assert "Fix: model = strategy.build_model(build_fn)" in message
    outside.compile(optimizer="adam", loss="mse")  # outside the scope: Keras's (a reference)
    data = strategy.distribute_dataset(
        lambda ctx: tf.data.Dataset.from_tensor_slices((x, y)).batch(4, drop_remainder=True))
    for fit in (outside.fit, lambda data, **kw: tfdist.fit(outside, data, **kw)):
        with pytest.raises(StrategyConfigError, match="so model.fit would run all of it"):
            fit(data, epochs=1, verbose=0)
    assert outside.fit(x, y, epochs=1, verbose=0).history["loss"]  # numpy, no scope: Keras's
    split = strategy.build_model(_model)
    with strategy.scope():
        split.compile(optimizer="adam", loss="mse")
    assert split.fit(data, epochs=1, verbose=0).history["loss"]  # build_model's: accepted
