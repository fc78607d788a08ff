"""Pipeline stages in one process: describing a model without its weights, splitting it, the
errors for models a pipeline cannot train (a loss added in ``call`` among them), and a
one-process pipeline (K=1, M micro-batches) that trains exactly like the plain model, with
regularizers too."""

from __future__ import annotations

import doctest
import hashlib
import importlib
import pickle

import numpy as np
import pytest
import tensorflow as tf

from tfdist.core import flavour
from tfdist.errors import StrategyConfigError
from tfdist.pipeline import stage

pytestmark = pytest.mark.unit

keras = flavour.get_keras()


def chain(widths=(6, 6, 4), features=3, batch_norm=False, regularize=False):
    layers = [keras.Input((features,))]
    for i, width in enumerate(widths):
        extra = {}
        if regularize:  # weight terms on every layer, an activity term on one
            extra = {"kernel_regularizer": keras.regularizers.L2(0.05),
                     "activity_regularizer": keras.regularizers.L1(0.05) if i == 1 else None}
        layers.append(keras.layers.Dense(width, activation="tanh", name=f"d{i}", **extra))
        if batch_norm and i == 0:
            layers.append(keras.layers.BatchNormalization(name="bn"))
    layers.append(keras.layers.Dense(1, name="out"))
    return keras.Sequential(layers, name="chain")


@pytest.mark.parametrize("name", ["tfdist.pipeline.stage", "tfdist.pipeline.keras_model",
                                  "tfdist.pipeline.loss_and_metrics",
                                  "tfdist.pipeline.local", "tfdist.pipeline.schedule",
                                  "tfdist.pipeline.modes", "tfdist.strategies.pipeline"])
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_describing_a_build_function_allocates_no_weights_and_a_stage_holds_its_own_only():
    spec = stage.describe_model(lambda: chain((300, 300)))
    assert spec.names == ("d0", "d1", "out")
    assert spec.params == (3 * 300 + 300, 300 * 300 + 300, 301)
    assert spec.shapes == ((3,), (300,), (300,), (1,))
    built = stage.build_stage(spec, (0, 1, 3), 1)
    assert [w.shape for w in built.get_weights()] == [(300, 300), (300,), (300, 1), (1,)]
    assert [layer.name for layer in built.layers
            if type(layer).__name__ != "InputLayer"] == ["d1", "out"]


class _Shift(keras.layers.Layer):
    """A user's layer without ``compute_output_shape``: Keras traces it symbolically."""

    def build(self, input_shape):
        self.shift = self.add_weight(shape=input_shape[-1:], initializer="ones")

    def call(self, x):
        return x + self.shift


@pytest.mark.timeout(60)
@pytest.mark.skipif(flavour.keras_flavour() != "keras3", reason="Keras 3's deferred variables")
def test_describing_a_users_layer_ends_and_allocates_no_weights():
    # Keras traces a layer without compute_output_shape in a StatelessScope whose exit
    # initialises every deferred variable; under abstract_build each re-registered itself in the
    # list being walked, and the walk never ended (transformer_lm's position embedding hung).
    from tfdist.compat.models import abstract_build

    with abstract_build():
        tokens = keras.Input((16,), dtype="int32")
        x = keras.layers.Embedding(32, 8)(tokens)
        model = keras.Model(tokens, _Shift()(x))
    assert model.count_params() == 32 * 8 + 8
    assert all(w._value is None for w in model.weights)


def test_weights_split_and_reassemble_to_the_same_model():
    whole = chain()
    spec, bounds = stage.split_model(whole, stages=2)
    parts = [stage.stage_weights(whole, spec, bounds, k) for k in range(2)]
    rebuilt = stage.assemble(spec, parts[0] + parts[1])
    x = np.random.default_rng(0).normal(size=(5, 3)).astype("float32")
    np.testing.assert_allclose(rebuilt.predict(x, verbose=0), whole.predict(x, verbose=0),
                               atol=1e-6)
    assert rebuilt.name == "chain"


@pytest.mark.parametrize("kwargs, words", [
    ({"stages": 5}, "The model has 4 layer(s), fewer than the 5 stages asked for."),
    ({"stages": 2, "split_points": ["nope"]}, "Split point 'nope' is not a layer of the model."),
    ({"stages": 3, "split_points": ["d2", "d1"]}, "Split points must be distinct and in the "
     "model's layer order."),
    ({"stages": 2, "split_points": ["d1", "d2"]}, "2 stages need 1 split point(s)."),
])
def test_bad_stages_and_split_points_are_named(kwargs, words):
    with pytest.raises(StrategyConfigError) as info:
        stage.split_model(chain(), **kwargs)
    assert words in str(info.value) and "Fix:" in str(info.value)


def test_a_skip_connection_across_stages_travels_with_the_cut():
    inputs = keras.Input((4,))
    a = keras.layers.Dense(4, name="a")(inputs)
    b = keras.layers.Dense(4, name="b")(a)
    added = keras.layers.Add(name="add")([a, b])
    whole = keras.Model(inputs, keras.layers.Dense(1, name="out")(added))
    spec, bounds = stage.split_model(whole, stages=2, split_points=["b"])
    assert spec.cuts(bounds) == ((1,),)  # a's output, read by b and by add
    spec, bounds = stage.split_model(whole, stages=2, split_points=["add"])
    assert spec.cuts(bounds) == ((1, 2),)  # a's and b's outputs
    parts = [stage.build_stage(spec, bounds, k) for k in range(2)]
    for k, part in enumerate(parts):
        stage.set_layer_weights(part, spec, stage.stage_layers(spec, bounds, k),
                                stage.stage_weights(whole, spec, bounds, k))
    x = np.random.default_rng(0).normal(size=(5, 4)).astype("float32")
    np.testing.assert_allclose(parts[1](parts[0]([x])), whole(x), atol=1e-6)


def test_batch_normalization_is_refused_with_micro_batches_and_allowed_without():
    with pytest.raises(StrategyConfigError) as info:
        stage.split_model(chain(batch_norm=True), stages=2, micro_batches=4)
    assert "Layer 'bn' is a BatchNormalization: with micro_batches=4" in str(info.value)
    stage.split_model(chain(batch_norm=True), stages=2, micro_batches=1)


@keras.saving.register_keras_serializable("test_pipeline_model")
class AddsMean(keras.layers.Layer):
    """Adds a loss computed from its inputs in ``call``."""

    def call(self, x):
        self.add_loss(tf.reduce_mean(tf.square(x)))
        return x


@keras.saving.register_keras_serializable("test_pipeline_model")
class Passes(keras.layers.Layer):
    def call(self, x):
        return x


def odd_rows(x):
    """An activity regularizer that is not a sum over the rows."""
    return tf.square(tf.reduce_sum(x))


@pytest.mark.parametrize("layer, what", [
    (lambda: AddsMean(name="adds"), "add_loss() in call()"),
    (lambda: keras.layers.Dense(6, activity_regularizer=odd_rows, name="adds"),
     "activity_regularizer function"),
])
def test_a_loss_added_in_call_is_refused_with_micro_batches_and_allowed_without(layer, what):
    def model():
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(6, name="d0"), layer(),
                                 keras.layers.Dense(1, name="out")])

    with pytest.raises(StrategyConfigError) as info:
        stage.split_model(model(), stages=2, micro_batches=4)
    message = str(info.value)
    assert f"Layer 'adds' adds a loss in each call ({what}" in message
    assert "micro_batches=4" in message and "Fix: use micro_batches=1" in message
    stage.split_model(model(), stages=2, micro_batches=1)


def test_regularizers_that_micro_batches_reproduce_are_accepted():
    model = keras.Sequential([
        keras.Input((3,)), keras.layers.Dense(6, name="d0", activity_regularizer="l2",
                                              kernel_regularizer="l1"),
        Passes(name="passes"), keras.layers.ActivityRegularization(0.1, 0.1, name="act"),
        keras.layers.Dense(1, name="out", activity_regularizer=keras.regularizers.L1L2(0.1))])
    assert stage.split_model(model, stages=2, micro_batches=4)[1][-1] == 4


def test_stages_without_processes_name_the_launch_command(monkeypatch):
    from tfdist.strategies.pipeline import PipelineStrategy

    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(StrategyConfigError) as info:
        PipelineStrategy(stages=2)
    assert "tfdist-launch --strategy pipeline --stages 2 --workers 2" in str(info.value)
    with pytest.raises(StrategyConfigError, match="micro_batches must be a positive int"):
        PipelineStrategy(micro_batches=0)
    with pytest.raises(StrategyConfigError, match="Unknown pipeline schedule"):
        PipelineStrategy(schedule="zigzag")


def test_fit_iterates_the_dataset_itself(monkeypatch):
    # OneDeviceStrategy's distributed dataset, built and torn down in every fit call, cost
    # tf-keras ~0.15 s a call for a prefetch to the device the data is already on
    from tfdist.strategies.pipeline import PipelineStrategy

    monkeypatch.delenv("TF_CONFIG", raising=False)
    dataset = tf.data.Dataset.range(4).batch(2)
    assert PipelineStrategy().experimental_distribute_dataset(dataset) is dataset


def test_both_engines_and_both_modes_answer_their_written_interface():
    import dataclasses

    from tfdist.pipeline import engine, local, modes

    def asked(protocol):
        return {name for name in vars(protocol) if not name.startswith("_")}

    def offered(cls):
        return set(dir(cls)) | {field.name for field in dataclasses.fields(cls)}

    assert asked(engine.PipelineEngine) == {
        "layout", "train", "forward", "replica_rows", "average_over_replicas", "share"}
    for cls in (engine.StageEngine, local.LocalPipeline):
        assert asked(engine.PipelineEngine) <= offered(cls), cls
    assert asked(modes.PipelineMode) == {"layout", "devices", "pieces", "where", "build",
                                         "sync_tied"}
    for cls in (modes.StagePerProcess, modes.StagesOnDevices, modes.ChunksPerProcess):
        assert asked(modes.PipelineMode) <= offered(cls), cls


def test_devices_are_checked_before_anything_starts():
    from tfdist.pipeline.local import resolve_devices

    cases = [
        (dict(devices=["/cpu:0", "/cpu:0"], stages=2, processes=2),
         "devices= places every stage in one process; this job has several."),
        (dict(devices=["/cpu:0"], stages=2, processes=1),
         "devices must name one device per stage."),
        (dict(devices=["/cpu:0", "not a device"], stages=2, processes=1),
         "A pipeline device must name a local device."),
        (dict(devices=["/cpu:0", "/cpu:7"], stages=2, processes=1),
         "Each stage needs its own device of this process."),
        (dict(devices=["/cpu:0", "/device:CPU:0"], stages=2, processes=1),
         "Each stage needs its own device of this process."),
    ]
    for kwargs, words in cases:
        with pytest.raises(StrategyConfigError) as info:
            resolve_devices(**kwargs)
        assert words in str(info.value) and "Fix:" in str(info.value), kwargs
    assert resolve_devices(None, stages=2, processes=2) == ()
    assert resolve_devices(["/cpu:0"], stages=1, processes=1) == ("/device:CPU:0",)


def _fit(model, x, y, weight, optimizer="sgd", plain=False):
    # Both optimizers are made here, outside any strategy.scope(): with Keras 3, Adam's
    # moments were then created under the wrong strategy and fit failed before the first step.
    made = keras.optimizers.Adam(0.01) if optimizer == "adam" else keras.optimizers.SGD(0.1)
    # The references run eagerly: no trace (about 1 CPU-s a reference fit), the same numbers
    # within float rounding
    model.compile(optimizer=made, loss="mse", metrics=["mae"], weighted_metrics=["mae"],
                  run_eagerly=plain)
    return model.fit(x, y, sample_weight=weight, batch_size=16, epochs=2, shuffle=False,
                     verbose=0).history


_references: dict[bytes, tuple[keras.Model, dict[str, list[float]]]] = {}


def _reference(initial, x, y, weight, optimizer="sgd", regularize=False):
    """The plain model made from ``initial`` and fit on the data, and its history: each once a
    process (the unweighted SGD fit is three tests' reference, 0.4 CPU-s each). Tests only read
    the model (evaluate, get_weights)."""
    key = hashlib.sha256(pickle.dumps((initial, x, y, weight, optimizer, regularize))).digest()
    if key not in _references:
        plain = chain(regularize=regularize)
        plain.set_weights(initial)
        _references[key] = plain, _fit(plain, x, y, weight, optimizer, plain=True)
    return _references[key]


@pytest.mark.parametrize("weighted, regularize, optimizer", [
    # make test-fast keeps the Adam fit; make test runs all four
    pytest.param(False, False, "sgd", marks=pytest.mark.slow),
    pytest.param(True, False, "sgd", marks=pytest.mark.slow),
    pytest.param(False, True, "sgd", marks=pytest.mark.slow), (False, False, "adam")])
def test_one_process_pipeline_with_micro_batches_trains_like_the_plain_model(
        monkeypatch, weighted, regularize, optimizer):
    from tfdist.strategies.pipeline import PipelineStrategy

    monkeypatch.delenv("TF_CONFIG", raising=False)
    keras.utils.set_random_seed(3)
    whole = chain(regularize=regularize)
    initial = whole.get_weights()
    rng = np.random.default_rng(1)
    x = rng.normal(size=(48, 3)).astype("float32")
    y = (x[:, :1] * x[:, 1:2]).astype("float32")
    weight = rng.uniform(0.0, 2.0, size=48).astype("float32") if weighted else None

    strategy = PipelineStrategy(micro_batches=4)
    model = strategy.build_model(whole)
    history = _fit(model, x, y, weight, optimizer)
    plain, reference = _reference(initial, x, y, weight, optimizer, regularize)
    gap = max(float(np.max(np.abs(a - b)))
              for a, b in zip(model.get_weights(), plain.get_weights(), strict=True))
    assert gap < 1e-5
    assert max(float(np.max(np.abs(a - b)))
               for a, b in zip(model.get_weights(), initial, strict=True)) > 1e-2
    assert sorted(history) == sorted(reference) == ["loss", "mae", "weighted_mae"]
    for name, values in reference.items():
        np.testing.assert_allclose(history[name], values, rtol=1e-5, err_msg=name)
    if regularize:  # evaluate adds the regularization too, as Keras's does
        got = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
        expected = plain.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
        assert sorted(got) == sorted(expected)
        for name, value in expected.items():
            assert got[name] == pytest.approx(value, rel=1e-5), name
        unregularized, _ = _reference(initial, x, y, None)
        assert max(float(np.max(np.abs(a - b))) for a, b in zip(
            model.get_weights(), unregularized.get_weights(), strict=True)) > 1e-3
    if weighted:  # the weights changed training: the unweighted model ends elsewhere
        unweighted, _ = _reference(initial, x, y, None)
        assert max(float(np.max(np.abs(a - b))) for a, b in zip(
            model.get_weights(), unweighted.get_weights(), strict=True)) > 1e-3

    with pytest.raises(StrategyConfigError, match="cannot be cut into 1 replica"):
        model.fit(x[:10], y[:10], batch_size=10, epochs=1, verbose=0)


def test_the_custom_loop_step_takes_sample_weights_like_fit(monkeypatch):
    from tfdist.strategies.pipeline import PipelineStrategy

    monkeypatch.delenv("TF_CONFIG", raising=False)
    keras.utils.set_random_seed(4)
    whole = chain()
    initial = whole.get_weights()
    rng = np.random.default_rng(2)
    x = rng.normal(size=(32, 3)).astype("float32")
    y = (x[:, :1] - x[:, 2:]).astype("float32")
    weight = rng.uniform(0.0, 2.0, size=32).astype("float32")
    strategy = PipelineStrategy(micro_batches=4)
    model = strategy.build_model(whole)
    step = strategy.train_step(model, "mse", keras.optimizers.SGD(0.1))
    losses = [float(step(x[i:i + 16], y[i:i + 16], weight[i:i + 16])) for i in (0, 16)]
    plain = chain()
    plain.set_weights(initial)
    plain.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", run_eagerly=True)
    history = plain.fit(x, y, sample_weight=weight, batch_size=16, shuffle=False, verbose=0)
    assert max(float(np.max(np.abs(a - b)))
               for a, b in zip(model.get_weights(), plain.get_weights(), strict=True)) < 1e-5
    assert np.mean(losses) == pytest.approx(history.history["loss"][0], rel=1e-5)


def test_a_finite_dataset_that_may_end_short_is_refused_before_the_first_step(monkeypatch):
    from tfdist.strategies.pipeline import PipelineStrategy

    monkeypatch.delenv("TF_CONFIG", raising=False)
    x = np.ones((38, 3), "float32")
    y = np.zeros((38, 1), "float32")
    strategy = PipelineStrategy(micro_batches=4)
    model = strategy.build_model(chain())
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    rows = tf.data.Dataset.from_tensor_slices((x, y))
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(StrategyConfigError) as info:  # 38 = 2 x 16 + 6: 6 rows in 4 micro-batches
        model.fit(rows.batch(16), epochs=1, verbose=0)
    assert "drop_remainder=True" in str(info.value) and "batch dimension None" in str(info.value)
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), before, strict=True))
    model.fit(rows.batch(16, drop_remainder=True), epochs=1, verbose=0)  # 2 full batches
    model.fit(rows.repeat().batch(16), steps_per_epoch=3, epochs=1, verbose=0)  # never ends


def test_the_custom_loop_step_is_traced_once(monkeypatch):
    # Adam's slots made in the step's first trace would make tf.function trace it twice
    from tfdist.strategies import pipeline

    monkeypatch.delenv("TF_CONFIG", raising=False)
    traces = []
    apply_step = pipeline.apply_step
    monkeypatch.setattr(pipeline, "apply_step",
                        lambda *args: traces.append(1) or apply_step(*args))
    strategy = pipeline.PipelineStrategy(micro_batches=2)
    model = strategy.build_model(chain())
    step = strategy.train_step(model, "mse", keras.optimizers.Adam(0.01))
    x, y = np.ones((8, 3), "float32"), np.zeros((8, 1), "float32")
    for i in (0, 4):
        step(x[i:i + 4], y[i:i + 4])
    assert len(traces) == 1


def test_a_tf_keras_fit_traces_the_step_once(monkeypatch):
    # tf-keras builds the optimizer in the first trace of fit's step, which tf.function then
    # traces again (Keras 3 builds it before fit under a strategy)
    from tfdist.strategies.pipeline import PipelineStrategy

    monkeypatch.delenv("TF_CONFIG", raising=False)
    k = flavour.get_keras("tf_keras")
    whole = k.Sequential([k.Input((3,)), k.layers.Dense(4, name="a"), k.layers.Dense(1, name="b")])
    model = PipelineStrategy(micro_batches=2).build_model(whole)
    traces = []
    train_step = model.train_step
    model.train_step = lambda data: traces.append(1) or train_step(data)
    model.compile(k.optimizers.Adam(0.01), "mse")
    model.fit(np.ones((8, 3), "float32"), np.zeros((8, 1), "float32"), batch_size=4, verbose=0)
    assert len(traces) == 1
