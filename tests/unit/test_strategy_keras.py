"""Keras flavour x strategy: every built-in trains with both; an unsupported pair (a strategy's
own traits) fails with the documented fix; the Keras 3 shims are version-guarded; and
TF_CONFIG is checked before TensorFlow could wait for a peer."""

from __future__ import annotations

import dataclasses
import importlib
import json

import pytest

import tfdist.strategies
from tfdist import compat
from tfdist.core.flavour import flavour_of, get_keras
from tfdist.errors import ClusterConfigError, KerasCompatibilityError, StrategyConfigError
from tfdist.strategies import StrategyTraits, strategy_traits

pytestmark = pytest.mark.unit

PS_CLUSTER = {"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]}


@pytest.fixture
def keras3(monkeypatch):
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)


@pytest.fixture
def tf_keras(monkeypatch):
    # Only the flavour check reads this; no strategy here gets far enough to touch Keras.
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")


def test_keras3_refused_where_traits_say_so(keras3):
    traits = StrategyTraits(keras=("tf_keras",), keras_unsupported="my reason")
    with pytest.raises(KerasCompatibilityError) as info:
        traits.check_keras("mine")
    message = str(info.value)
    assert message.startswith("Strategy 'mine' cannot train with Keras 3: my reason")
    assert "Fix: set TF_USE_LEGACY_KERAS=1 before TensorFlow is imported" in message


@pytest.mark.parametrize("name", ["default", "mirrored", "multi_worker", "parameter_server",
                                  "horovod"])
def test_every_builtin_strategy_trains_with_both_kerases(name):
    for flavour in ("keras3", "tf_keras"):
        strategy_traits(name).check_keras(name, flavour)
    assert not strategy_traits(name).needs_tf_keras


def test_shims_apply_only_to_keras_versions_with_the_bug():
    installed = compat.keras_version()
    for shim in compat.KERAS3_SHIMS:
        assert shim.issue and shim.verified
        assert not shim.applies((2, 15, 0))  # tf-keras's line never
        assert shim.applies(installed) == (
            shim.fixed_in is None or installed < shim.fixed_in)  # still broken in 3.15
        fixed = dataclasses.replace(shim, fixed_in=installed)
        assert not fixed.applies(installed)  # a release that fixes it switches the shim off
        probe_says_fixed = dataclasses.replace(shim, still_broken=lambda: False)
        assert not probe_says_fixed.applies(installed)


def test_shims_off_switch(keras3, monkeypatch):
    monkeypatch.setenv(compat.SHIMS_ENV, "off")
    assert compat.install_keras3_shims() == {}
    assert compat.shims_enabled({compat.SHIMS_ENV: "on"})


@pytest.mark.parametrize("name", ["default", "mirrored"])
def test_keras3_accepts_single_host_strategies(keras3, name):
    assert tfdist.strategies.get_strategy(name).name == name


def test_missing_tf_config_raises_before_waiting(tf_keras, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ClusterConfigError, match="TF_CONFIG environment variable is not set"):
        tfdist.strategies.get_strategy("multi_worker")


def test_role_typo_raises_before_waiting(tf_keras, monkeypatch):
    config = {"cluster": {"wroker": ["localhost:1", "localhost:2"]},
              "task": {"type": "worker", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    with pytest.raises(ClusterConfigError, match="'wroker' is not a known role"):
        tfdist.strategies.get_strategy("multi_worker")


def test_multi_worker_refuses_a_ps_cluster(tf_keras):
    config = {"cluster": PS_CLUSTER, "task": {"type": "chief", "index": 0}}
    with pytest.raises(ClusterConfigError, match="does not use parameter servers"):
        tfdist.strategies.get_strategy("multi_worker", tf_config=config)


def test_parameter_server_needs_ps(tf_keras):
    config = {"cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"]},
              "task": {"type": "chief", "index": 0}}
    with pytest.raises(ClusterConfigError, match="needs a ps task"):
        tfdist.strategies.get_strategy("parameter_server", tf_config=config)


@pytest.mark.parametrize("task", ["worker", "ps"])
def test_parameter_server_runs_on_the_chief_only(tf_keras, task):
    config = {"cluster": PS_CLUSTER, "task": {"type": task, "index": 0}}
    with pytest.raises(StrategyConfigError) as info:
        tfdist.strategies.get_strategy("parameter_server", tf_config=config)
    message = str(info.value)
    assert f"Strategy 'parameter_server' is not created on a '{task}' task." in message
    assert f"run `python -m tfdist.server` on {task}:0" in message


def test_evaluator_is_sent_to_the_default_strategy(tf_keras):
    config = {"cluster": {"worker": ["localhost:1", "localhost:2"]},
              "task": {"type": "evaluator", "index": 0}}
    with pytest.raises(StrategyConfigError, match=r"use get_strategy\('default'\)"):
        tfdist.strategies.get_strategy("multi_worker", tf_config=config)


def test_keras3_parameter_server_refuses_sharding_with_the_fix(keras3):
    config = {"cluster": PS_CLUSTER, "task": {"type": "chief", "index": 0}}
    with pytest.raises(KerasCompatibilityError) as info:
        tfdist.strategies.get_strategy("parameter_server", num_shards=2, tf_config=config)
    message = str(info.value)
    assert "cannot shard variables under Keras 3" in message
    assert "Received: a variable partitioner (FixedShardsPartitioner) with Keras 3." in message
    assert "Fix: drop the partitioner" in message


def test_fit_refuses_what_the_coordinator_cannot_honour(keras3, monkeypatch):
    import numpy as np

    from tfdist import training

    monkeypatch.setattr(compat, "fit_needs_coordinator", lambda strategy, model: True)
    model = get_keras().Sequential([get_keras().layers.Dense(1)])
    with pytest.raises(StrategyConfigError) as info:
        training.fit(model, np.ones((4, 2)), class_weight={0: 1.0}, epochs=1)
    message = str(info.value)
    assert "Received: class_weight." in message
    assert "Fix: batch, weight and shuffle samples in dataset_fn" in message
    with pytest.raises(StrategyConfigError) as info:
        training.fit(model, np.ones((4, 2)), epochs=1, steps_per_epoch=2)
    assert "Received: x=ndarray." in str(info.value)
    assert "Fix: pass x=dataset_fn (it shards with input_context)" in str(info.value)
    with pytest.raises(StrategyConfigError, match="needs validation_steps"):
        training.fit(model, lambda ctx: None, validation_data=lambda ctx: None,
                     steps_per_epoch=2)
    data = training.PerWorkerInput(lambda ctx: None, lambda ctx: None)
    with pytest.raises(StrategyConfigError, match="needs steps_per_epoch"):
        training.fit(model, data, epochs=1)
    assert "tfdist.fit(model, this, ...)" in repr(data)


def test_keras3_names_the_fix_for_tf_keras_only_names(keras3):
    import tensorflow as tf

    compat.install_keras3_shims()
    if flavour_of(tf.keras.Sequential()) != "keras3":
        pytest.skip("tf.keras is tf-keras in this process")
    with pytest.raises(AttributeError) as info:
        tf.keras.utils.experimental.DatasetCreator  # noqa: B018 - the guide's line
    assert "is tf-keras (Keras 2) only" in str(info.value)
    assert "Fix: set TF_USE_LEGACY_KERAS=1" in str(info.value)
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        tf.keras.utils.nothing_here  # noqa: B018


def _fit_traces(install: bool) -> tuple[int, list[float], list[str]]:
    """(train-step traces, losses, optimizer variable paths) of a fresh Adam ``fit``, no
    strategy, with or without the ``optimizer_built_before_fit`` shim."""
    import keras
    import numpy as np
    from tensorflow.python.framework import func_graph

    shim = next(s for s in compat.KERAS3_SHIMS if s.name == "optimizer_built_before_fit")
    trainer = importlib.import_module(compat._TRAINER).TensorFlowTrainer
    before, traced = trainer.fit, []
    original_trace = func_graph.func_graph_from_py_func

    def counting(name, *args, **kwargs):
        traced.append(str(name))
        return original_trace(name, *args, **kwargs)

    try:
        if install and "optimizer_built_before_fit" not in compat._installed:
            shim.install()
        elif not install:
            trainer.fit = getattr(trainer.fit, "__wrapped_by_tfdist__", trainer.fit)
        func_graph.func_graph_from_py_func = counting
        keras.backend.clear_session()  # the same layer and optimizer names in both runs
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        x = np.random.default_rng(0).normal(size=(32, 5)).astype("float32")
        losses = model.fit(x, 2 * x[:, :1], batch_size=16, epochs=2, verbose=0).history["loss"]
    finally:
        func_graph.func_graph_from_py_func = original_trace
        trainer.fit = before
    return (traced.count("one_step_on_data"), losses,
            [v.path for v in model.optimizer.variables])


@pytest.mark.slow  # two fits (2 CPU-s): make test, not test-fast
def test_a_fit_without_strategy_traces_its_step_once_with_the_same_numbers(keras3):
    """Keras 3 builds the optimizer inside the first trace when no strategy is set, and a
    tf.function whose first trace creates variables traces twice; the shim builds it first."""
    plain_traces, plain_losses, plain_paths = _fit_traces(install=False)
    traces, losses, paths = _fit_traces(install=True)
    assert (plain_traces, traces) == (2, 1)
    assert losses == plain_losses and paths == plain_paths
    assert paths[2] == "adam/sequential_dense_kernel_momentum"


@pytest.mark.parametrize("inside_scope", [True, False])
def test_an_optimizer_made_outside_the_scope_is_named_with_the_fix(keras3, inside_scope):
    import numpy as np

    keras = get_keras()
    if flavour_of(keras.Sequential()) != "keras3":
        pytest.skip("Keras 3 only: tf-keras optimizers build their slots under the model's scope")
    strategy = tfdist.get_strategy("mirrored")
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        if inside_scope:
            model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    if not inside_scope:
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    x, y = np.ones((8, 2), "float32"), np.ones((8, 1), "float32")
    if inside_scope:
        assert len(tfdist.fit(model, x, y, epochs=1, verbose=0).history["loss"]) == 1
        return
    with pytest.raises(StrategyConfigError) as info:
        tfdist.fit(model, x, y, epochs=1, verbose=0)
    message = str(info.value)
    assert "Adam made under _DefaultDistributionStrategy, the model under MirroredStrategy" \
        in message
    assert "Fix: call model.compile(optimizer=...) inside the `with strategy.scope():`" in message
