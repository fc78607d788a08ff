"""The pipeline's one-device semantics, in one process: sparse gradients kept in their form
(concatenated across micro-batches), optimizer options accepted or refused naming the option,
BatchNormalization found anywhere in a stage (custom layers, nested models) and refused with
M > 1 unless opted in, and the opt-in training as GPipe does (per-micro-batch statistics)."""

from __future__ import annotations

import doctest
import functools
import importlib

import numpy as np
import pytest
import tensorflow as tf

from tfdist.core import flavour
from tfdist.errors import StrategyConfigError
from tfdist.parallel.mesh import ProcessGroup
from tfdist.pipeline import batch_norm, gradients, optimizers, schedule
from tfdist.pipeline.config import PipelineConfig
from tfdist.strategies.pipeline import PipelineStrategy

pytestmark = pytest.mark.unit

keras = flavour.get_keras()
ONE = ProcessGroup(key=1, members=(0,), rank=0)


@pytest.mark.parametrize("name", ["tfdist.pipeline.gradients", "tfdist.pipeline.optimizers",
                                  "tfdist.pipeline.batch_norm"])
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_sparse_gradients_are_concatenated_and_mixed_ones_added_densely():
    shape = tf.constant([3, 2])
    a = tf.IndexedSlices(tf.ones([2, 2]), tf.constant([0, 2]), shape)
    b = tf.IndexedSlices(2 * tf.ones([1, 2]), tf.constant([2]), shape)
    sums = [None, None]
    gradients.accumulate(sums, [a, None])
    gradients.accumulate(sums, [b, tf.ones([2])])
    assert gradients.is_sparse(sums[0]) and sums[0].indices.numpy().tolist() == [0, 2, 2]
    assert sums[1].numpy().tolist() == [1.0, 1.0]
    dense = gradients.add(sums[0], tf.ones([3, 2]))
    assert dense.numpy().tolist() == [[2, 2], [1, 1], [4, 4]]
    assert gradients.average_over_group(sums, ONE) == sums


class Block(keras.layers.Layer):
    """A custom layer holding a BatchNormalization as an attribute."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(4)
        self.norm = keras.layers.BatchNormalization(name="hidden_bn")

    def call(self, x, training=None):
        return self.norm(self.dense(x), training=training)


def model_with(kind):
    inner = {"custom": lambda: Block(name="block"),
             "nested": lambda: keras.Sequential([keras.layers.Dense(4),
                                                 keras.layers.BatchNormalization(
                                                     name="hidden_bn")], name="block"),
             "none": lambda: keras.layers.Dense(4, name="block")}[kind]()
    return keras.Sequential([keras.Input((3,)), inner, keras.layers.Dense(1, name="out")],
                            name="m")


@pytest.mark.parametrize("kind", ["custom", "nested"])
def test_batch_normalization_inside_a_layer_or_nested_model_is_found_and_refused(kind):
    model = model_with(kind)
    model(np.zeros((2, 3), "float32"))
    assert batch_norm.find(model) == ["block/hidden_bn"]
    assert batch_norm.find(model_with("none")) == []
    with pytest.raises(StrategyConfigError) as info:
        batch_norm.check_stage(model, 4, "refuse", ONE)
    message = str(info.value)
    assert "'block/hidden_bn'" in message
    # the opt-in by its argument, its launcher flag and its variable
    assert "get_strategy(..., batch_norm='per_micro_batch')" in message
    assert "tfdist-launch --batch-norm per_micro_batch" in message
    assert "TFDIST_PIPELINE_BATCH_NORM=per_micro_batch" in message
    batch_norm.check_stage(model, 1, "refuse", ONE)  # exact with one micro-batch
    batch_norm.check_stage(model, 4, "per_micro_batch", ONE)  # the explicit opt-in


def test_the_batch_norm_policy_is_checked():
    with pytest.raises(StrategyConfigError, match="Unknown batch_norm policy"):
        PipelineConfig(batch_norm="sync")
    assert PipelineConfig(batch_norm="per_micro_batch").batch_norm == "per_micro_batch"


def test_a_strategy_refuses_a_nested_batch_norm_with_micro_batches():
    with pytest.raises(StrategyConfigError, match="hidden_bn") as info:  # flattened "block"
        PipelineStrategy(micro_batches=2).build_model(lambda: model_with("nested"))
    assert "tfdist-launch --batch-norm per_micro_batch" in str(info.value)
    assert "batch_norm='per_micro_batch'" in str(info.value)


def test_the_opt_in_is_read_from_the_launchers_variable(monkeypatch):
    from tfdist.pipeline.config import BATCH_NORM_ENV

    monkeypatch.setenv(BATCH_NORM_ENV, "per_micro_batch")
    assert PipelineConfig.from_env().batch_norm == "per_micro_batch"
    assert PipelineConfig.from_env().env()[BATCH_NORM_ENV] == "per_micro_batch"
    assert PipelineConfig.from_env(batch_norm="refuse").batch_norm == "refuse"  # argument wins
    monkeypatch.setenv(BATCH_NORM_ENV, "sync")
    with pytest.raises(StrategyConfigError, match=r"\$TFDIST_PIPELINE_BATCH_NORM is not valid"):
        PipelineConfig.from_env()


def per_micro_batch_reference(model, x, y, micro_batches, lr):
    """One SGD step of ``model`` with each micro-batch normalised by its own statistics."""
    with tf.GradientTape() as tape:
        losses = [tf.reduce_mean(tf.square(model(xm, training=True) - ym)) / micro_batches
                  for xm, ym in zip(np.split(x, micro_batches), np.split(y, micro_batches),
                                    strict=True)]
        loss = tf.add_n(losses)
    grads = tape.gradient(loss, model.trainable_variables)
    for g, v in zip(grads, model.trainable_variables, strict=True):
        v.assign_sub(lr * g)


def test_the_opt_in_trains_with_per_micro_batch_statistics_as_gpipe():
    keras.utils.set_random_seed(2)
    whole = model_with("nested")
    whole(np.zeros((2, 3), "float32"))
    initial = [w.copy() for w in whole.get_weights()]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 3)).astype("float32")
    y = rng.normal(size=(8, 1)).astype("float32")
    strategy = PipelineStrategy(micro_batches=2, batch_norm="per_micro_batch")
    model = strategy.build_model(whole)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    reference = model_with("nested")
    reference(np.zeros((2, 3), "float32"))
    reference.set_weights(initial)
    per_micro_batch_reference(reference, x, y, 2, 0.1)
    gap = max(np.max(np.abs(a - b)) for a, b in zip(model.get_weights(),
                                                   reference.get_weights(), strict=True))
    assert gap < 1e-5  # weights and the moving statistics (updated once per micro-batch)
    whole_batch = model_with("nested")
    whole_batch(np.zeros((2, 3), "float32"))
    whole_batch.set_weights(initial)
    per_micro_batch_reference(whole_batch, x, y, 1, 0.1)
    assert max(np.max(np.abs(a - b)) for a, b in zip(
        model.get_weights(), whole_batch.get_weights(), strict=True)) > 1e-3


@pytest.mark.parametrize("kwargs, option", [
    ({"loss_scale_factor": 8.0}, "loss_scale_factor"),
    ({"global_clipnorm": 1.0, "gradient_accumulation_steps": 2}, "gradient_accumulation_steps"),
])
def test_options_the_pipeline_cannot_apply_exactly_are_refused_by_name(kwargs, option):
    if flavour.keras_flavour() == "tf_keras":
        pytest.skip("Keras 3 options")
    with pytest.raises(StrategyConfigError) as info:
        optimizers.check_optimizer(keras.optimizers.Adam(**kwargs), spans_processes=True)
    assert option in str(info.value) and "Fix:" in str(info.value)


def test_a_loss_scale_optimizer_is_refused_and_per_variable_options_accepted():
    with pytest.raises(StrategyConfigError, match="LossScaleOptimizer"):
        optimizers.check_optimizer(keras.mixed_precision.LossScaleOptimizer(
            keras.optimizers.SGD()), spans_processes=True)
    for kwargs in ({"clipnorm": 1.0}, {"clipvalue": 1.0}, {"global_clipnorm": 1.0},
                   {"weight_decay": 0.1}, {"use_ema": True}):
        optimizers.check_optimizer(keras.optimizers.Adam(**kwargs), spans_processes=True)


@pytest.mark.parametrize("schedule", [pytest.param("gpipe", marks=pytest.mark.slow), "1f1b"])
def test_recomputation_trains_as_keeping_the_activations(schedule):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 3)).astype("float32")
    y = rng.normal(size=(8, 1)).astype("float32")
    keras.utils.set_random_seed(3)
    whole = model_with("none")
    whole(np.zeros((2, 3), "float32"))
    initial = [w.copy() for w in whole.get_weights()]
    trained = []
    for recompute in (False, True):
        strategy = PipelineStrategy(micro_batches=4, schedule=schedule, recompute=recompute)
        whole.set_weights(initial)
        model = strategy.build_model(whole)
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        trained.append(model.get_weights())
    assert max(np.max(np.abs(a - b)) for a, b in zip(*trained, strict=True)) < 1e-6
    assert max(np.max(np.abs(a - b)) for a, b in zip(trained[1], initial, strict=True)) > 1e-2


@pytest.mark.parametrize("stages, micro_batches, chunks", [
    (2, 2, 2), (2, 4, 2), (2, 8, 2), (3, 6, 2), (4, 8, 3), (4, 4, 1), (2, 4, 1)])
def test_interleaved_1f1b_runs_every_op_once_with_the_smaller_bubble(stages, micro_batches,
                                                                      chunks):
    plans = [schedule.interleaved(stages, micro_batches, k, chunks) for k in range(stages)]
    order = schedule.simulate(plans)  # raises on a deadlock
    expected = {(op, m, c) for op in "FB" for m in range(micro_batches) for c in range(chunks)}
    for plan in plans:
        assert sorted(plan) == sorted(expected) and len(plan) == len(expected)
    assert len(order) == 2 * stages * micro_batches * chunks
    time = schedule.step_time(plans)
    ideal = 3.0 * micro_batches
    bubble = (time - ideal) / time
    assert bubble == pytest.approx(schedule.interleaved_bubble_fraction(
        stages, micro_batches, chunks))
    if chunks == 1:  # the plain 1F1B's bubble and step
        assert bubble == pytest.approx(schedule.bubble_fraction(stages, micro_batches))


def test_interleaving_needs_micro_batches_in_groups_of_k():
    with pytest.raises(StrategyConfigError, match="multiple of 2"):
        schedule.interleaved(2, 3, 0, 2)


def _embedding_model():
    keras.utils.set_random_seed(5)
    return keras.Sequential([keras.Input((3,), dtype="int32"),
                             keras.layers.Embedding(7, 4, name="words"),
                             keras.layers.Flatten(name="flat"),
                             keras.layers.Dense(5, activation="tanh", name="hidden",
                                                activity_regularizer=keras.regularizers.L2(0.1)),
                             keras.layers.Dense(1, name="out")], name="embedded")


def _embedding_data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)
    x = rng.integers(0, 7, size=(24, 3)).astype("int32")
    y = rng.normal(size=(24, 1)).astype("float32")
    return x, y, rng.uniform(0.5, 2.0, size=24).astype("float32")


def _fit_embedding_model(model: keras.Model, eagerly: bool) -> list[np.ndarray]:
    model.compile(optimizer=keras.optimizers.Adam(0.05, clipnorm=0.5), loss="mse",
                  run_eagerly=eagerly)
    x, y, weights = _embedding_data()
    model.fit(x, y, sample_weight=weights, batch_size=8, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()


@functools.cache
def _one_device_weights() -> tuple[np.ndarray, ...]:
    """The one-device reference, fit eagerly (no trace) once a process for both schedules."""
    return tuple(_fit_embedding_model(_embedding_model(), eagerly=True))


@pytest.mark.parametrize("schedule", [pytest.param("gpipe", marks=pytest.mark.slow), "1f1b"])
def test_whole_batch_weight_gradients_train_as_one_device(schedule):
    """Adam with clipnorm, an Embedding (its gradient's rows in batch order), an activity
    regularizer and sample weights: 3 steps at M=4 equal one device within 1e-6."""
    options = {"micro_batches": 4, "schedule": schedule, "weight_gradients": "whole_batch"}
    trained = [list(_one_device_weights()), _fit_embedding_model(
        PipelineStrategy(**options).build_model(_embedding_model), eagerly=False)]
    assert max(np.max(np.abs(a - b)) for a, b in zip(*trained, strict=True)) < 1e-6
    assert max(np.max(np.abs(a - b)) for a, b in zip(trained[1], _embedding_model().get_weights(),
                                                     strict=True)) > 1e-2


def test_whole_batch_weight_gradients_refuse_what_a_second_run_would_change():
    with pytest.raises(StrategyConfigError, match="recompute") as info:
        PipelineConfig(micro_batches=2, schedule="1f1b", recompute=True,
                       weight_gradients="whole_batch")
    assert "Fix:" in str(info.value)
    with pytest.raises(StrategyConfigError, match="gpipe or 1f1b"):
        PipelineConfig(stages=2, micro_batches=2, schedule="zb-h1",
                       weight_gradients="whole_batch")
    with pytest.raises(StrategyConfigError, match="Unknown weight_gradients"):
        PipelineConfig(weight_gradients="mean")
    strategy = PipelineStrategy(micro_batches=2, weight_gradients="whole_batch")
    with pytest.raises(StrategyConfigError, match=r"random layers \['drop'\]"):
        strategy.build_model(lambda: keras.Sequential([
            keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dropout(0.5, name="drop")]))
