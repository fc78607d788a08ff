"""Keras flavour x strategy: unsupported pairs fail at creation with the documented fix, and
TF_CONFIG is checked before TensorFlow could wait for a peer."""

from __future__ import annotations

import json

import pytest

import tfdist.strategies
from tfdist.errors import ClusterConfigError, KerasCompatibilityError, StrategyConfigError

pytestmark = pytest.mark.unit

PS_CLUSTER = {"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]}


@pytest.fixture
def keras3(monkeypatch):
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)


@pytest.fixture
def tf_keras(monkeypatch):
    # Only the flavour check reads this; no strategy here gets far enough to touch Keras.
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("multi_worker", "Keras 3's model.fit fails under MultiWorkerMirroredStrategy on TF 2.21"),
        ("parameter_server", "Keras 3 has no ParameterServerStrategy support at all"),
    ],
)
def test_keras3_refuses_multi_process_tf_strategies(keras3, name, why):
    with pytest.raises(KerasCompatibilityError) as info:
        tfdist.strategies.get_strategy(name)
    message = str(info.value)
    assert message.startswith(f"Strategy {name!r} cannot train with Keras 3: {why}")
    assert "Fix: set TF_USE_LEGACY_KERAS=1 before TensorFlow is imported" in message
    assert "or use strategy='horovod', which works with Keras 3" in message


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
