"""In-process checks of tfdist.horovod and HorovodStrategy (one rank: Horovod's size is 1)."""

from __future__ import annotations

import doctest
import importlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tfdist.errors import KerasCompatibilityError, MissingDependencyError, StrategyConfigError
from tfdist.horovod import runtime
from tfdist.horovod.data import slice_bounds, split_global_batches

horovod = pytest.mark.horovod

DOCTESTED = ["tfdist.horovod.runtime", "tfdist.horovod.ops", "tfdist.horovod.data",
             "tfdist.horovod.optimizer", "tfdist.horovod.callbacks", "tfdist.horovod.checks",
             "tfdist.strategies.horovod"]


@horovod
@pytest.mark.parametrize("name", DOCTESTED)
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
    assert result.attempted > 0


def test_missing_horovod_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "horovod.tensorflow", None)
    with pytest.raises(MissingDependencyError) as info:
        runtime.hvd()
    message = str(info.value)
    assert "Received: no importable horovod.tensorflow" in message
    assert ("Fix: build it into this environment: `make horovod` in the tfdist checkout (it "
            "runs `bash launch/setup.sh`") in message
    assert runtime.is_available() is False


def test_split_global_batches_gives_each_rank_its_rows() -> None:
    dataset = tf.data.Dataset.from_tensor_slices((np.arange(9), np.arange(9) * 10)).batch(4)
    parts = [[(x.numpy().tolist(), y.numpy().tolist()) for x, y in
              split_global_batches(dataset, 2, rank)] for rank in (0, 1)]
    assert parts[0] == [([0, 1], [0, 10]), ([4, 5], [40, 50]), ([], [])]  # a last batch of 1
    assert parts[1] == [([2, 3], [20, 30]), ([6, 7], [60, 70]), ([8], [80])]
    assert [slice_bounds(7, 3, i) for i in range(3)] == [(0, 2), (2, 4), (4, 7)]


def test_split_global_batches_rejects_unbatched_data() -> None:
    with pytest.raises(StrategyConfigError) as info:
        split_global_batches(tf.data.Dataset.range(4), 2, 0)
    assert "Received: elements with a scalar component" in str(info.value)
    assert "Fix: call dataset.batch(global_batch_size) first" in str(info.value)


@horovod
def test_distributed_optimizer_rejects_non_keras_optimizers() -> None:
    from tfdist.horovod import DistributedOptimizer

    with pytest.raises(KerasCompatibilityError) as info:
        DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    assert "Received: tensorflow.python.training.gradient_descent." in str(info.value)
    assert "Expected: a keras.optimizers or tf_keras.optimizers optimizer" in str(info.value)


@horovod
@pytest.mark.parametrize("option, value", [("op", "mean"), ("compression", "gzip")])
def test_distributed_optimizer_checks_options(option: str, value: str) -> None:
    import keras

    from tfdist.horovod import DistributedOptimizer

    with pytest.raises(StrategyConfigError) as info:
        DistributedOptimizer(keras.optimizers.SGD(), **{option: value})
    assert f"Received: {option}={value!r}" in str(info.value)


@horovod
@pytest.mark.parametrize("flavour, method", [("keras3", "apply"), ("tf_keras", "apply_gradients")])
def test_distributed_optimizer_binds_per_flavour(flavour: str, method: str) -> None:
    from tfdist.core.flavour import get_keras
    from tfdist.horovod import DistributedOptimizer

    keras = get_keras(flavour)
    plain = keras.optimizers.SGD(0.5, momentum=0.25)
    wrapped = DistributedOptimizer(DistributedOptimizer(plain), op="sum")
    cls = type(wrapped)
    assert method in vars(cls) and cls.__bases__ == (type(plain),)  # re-wrapping does not stack
    assert vars(cls)["_allreduce"].__module__ == "horovod._keras"  # Horovod's implementation
    assert (cls.__name__, cls.__module__) == (type(plain).__name__, type(plain).__module__)
    assert wrapped.get_config() == plain.get_config()
    variable = tf.Variable([1.0, 2.0])
    wrapped.apply_gradients([(tf.constant([0.5, -1.0]), variable)])
    np.testing.assert_allclose(variable.numpy(), [0.75, 2.5])  # one rank: sum = the gradient


@horovod
def test_init_refuses_to_change_fusion_threshold_after_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(runtime.FUSION_THRESHOLD_ENV, raising=False)
    runtime.init()
    with pytest.raises(StrategyConfigError) as info:
        runtime.init(fusion_threshold_bytes=1 << 20)
    assert "Received: HOROVOD_FUSION_THRESHOLD=1048576 requested, None in effect" in str(info.value)
    monkeypatch.setenv(runtime.FUSION_THRESHOLD_ENV, str(1 << 20))
    assert runtime.init(fusion_threshold_bytes=1 << 20).size() == 1


@horovod
@pytest.mark.parametrize("options, received", [
    ({"compression": "gzip"}, "compression='gzip'"),
    ({"fusion_threshold_bytes": 0}, "fusion_threshold_bytes=0"),
    ({"cycle_time_ms": -1}, "cycle_time_ms=-1"),
])
def test_horovod_strategy_checks_options(options: dict, received: str) -> None:
    import tfdist.strategies

    with pytest.raises(StrategyConfigError) as info:
        tfdist.strategies.get_strategy("horovod", **options)
    assert f"Received: {received}" in str(info.value)


@horovod
def test_horovod_strategy_on_one_rank_trains_like_one_device() -> None:
    import keras

    from tfdist.horovod.callbacks import BroadcastVariablesCallback, MetricAverageCallback
    from tfdist.strategies.horovod import HorovodStrategy

    strategy = HorovodStrategy()
    assert (strategy.name, strategy.num_workers, strategy.worker_index) == ("horovod", 1, 0)
    assert [type(c) for c in strategy.callbacks()] == [
        type(BroadcastVariablesCallback()), type(MetricAverageCallback())]
    x = np.arange(12, dtype="float32").reshape(6, 2) / 10
    y = x.sum(axis=1, keepdims=True)
    weights = [np.array([[0.5], [-0.5]], "float32"), np.zeros(1, "float32")]
    models = []
    for scope in (strategy, tf.distribute.OneDeviceStrategy("/cpu:0")):
        with scope.scope():
            model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        model.set_weights(weights)
        model.fit(x, y, batch_size=2, shuffle=False, verbose=0)
        models.append(model.get_weights())
    for got, want in zip(*models, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    assert np.abs(models[0][0] - weights[0]).max() > 1e-3


@horovod
def test_distributed_optimizer_steps_aside_in_horovod_strategy_and_saves_as_keras() -> None:
    import keras

    from tfdist.horovod import DistributedOptimizer
    from tfdist.strategies.horovod import HorovodStrategy

    plain = keras.optimizers.SGD(0.1)
    with HorovodStrategy().scope():
        assert DistributedOptimizer(plain) is plain  # the strategy already all-reduces
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=DistributedOptimizer(plain), loss="mse")
    model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0)
    path = Path(tempfile.mkdtemp()) / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)  # needs the Keras module in the saved config
    assert type(loaded.optimizer) is keras.optimizers.SGD
    np.testing.assert_allclose(loaded.get_weights()[0], model.get_weights()[0])


@horovod
def test_callbacks_are_horovods_implementation_bound_per_flavour() -> None:
    from horovod._keras import callbacks as horovod_callbacks

    from tfdist.core.flavour import get_keras
    from tfdist.horovod import BroadcastVariablesCallback, MetricAverageCallback

    for flavour in ("keras3", "tf_keras"):
        broadcast = BroadcastVariablesCallback(1, flavour=flavour)
        average = MetricAverageCallback(flavour=flavour)
        assert isinstance(broadcast, horovod_callbacks.BroadcastGlobalVariablesCallbackImpl)
        assert isinstance(average, horovod_callbacks.MetricAverageCallbackImpl)
        assert isinstance(broadcast, get_keras(flavour).callbacks.Callback)
        assert isinstance(broadcast, BroadcastVariablesCallback) and broadcast.root_rank == 1


@horovod
@pytest.mark.parametrize("get", ["init", "strategy"])
def test_horovod_without_ranks_in_a_multi_task_job_is_refused(
        monkeypatch: pytest.MonkeyPatch, get: str) -> None:
    import tfdist.strategies

    tf_config = {"cluster": {"worker": ["localhost:1", "localhost:2"]},
                 "task": {"type": "worker", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    with pytest.raises(StrategyConfigError) as info:
        runtime.init() if get == "init" else tfdist.strategies.get_strategy("horovod")
    message = str(info.value)
    assert message.startswith("Horovod has no ranks: this process trains alone")
    assert "Received: TF_CONFIG with 2 tasks (this one worker:0)" in message
    assert "Fix: launch with `tfdist-launch --strategy horovod --workers 2 script.py`" in message
    monkeypatch.delenv("TF_CONFIG")
    assert runtime.init().size() == 1  # alone on purpose: Horovod's single-process mode
