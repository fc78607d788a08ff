"""The registry: names, lazy entries, unknown names and options, and the "auto" log line."""

from __future__ import annotations

import logging

import pytest

import tfdist.strategies
from tfdist.errors import StrategyConfigError
from tfdist.strategies import registry

pytestmark = pytest.mark.unit

BUILTINS = ("default", "mirrored", "multi_worker", "parameter_server", "horovod", "auto")


def test_builtin_names():
    assert tfdist.strategies.available_strategies() == BUILTINS


def test_horovod_is_registered_lazily():
    # Stored as "module:Class" until asked for, so Horovod stays optional.
    target = registry._REGISTRY["horovod"]
    assert target == "tfdist.strategies.horovod:HorovodStrategy" or isinstance(target, type)


def test_classes_are_tf_strategies_with_the_mixin():
    import tensorflow as tf

    from tfdist.strategies.base import TfdistStrategyMixin

    expected = {
        "default": tf.distribute.OneDeviceStrategy,
        "mirrored": tf.distribute.MirroredStrategy,
        "multi_worker": tf.distribute.MultiWorkerMirroredStrategy,
        "parameter_server": tf.distribute.experimental.ParameterServerStrategy,
    }
    for name, tf_base in expected.items():
        cls = tfdist.strategies.get_strategy_class(name)
        assert issubclass(cls, tf_base) and issubclass(cls, TfdistStrategyMixin)
        assert cls.name == name


def test_unknown_name_lists_valid_names_and_suggests():
    with pytest.raises(StrategyConfigError) as info:
        tfdist.strategies.get_strategy("mirored")
    assert str(info.value) == (
        "Unknown strategy 'mirored'. Received: 'mirored'. Expected: one of default, mirrored, "
        "multi_worker, parameter_server, horovod, auto. Fix: did you mean 'mirrored'? or "
        "register your own with tfdist.strategies.register()"
    )


def test_unknown_option_lists_valid_options():
    with pytest.raises(StrategyConfigError) as info:
        tfdist.strategies.get_strategy("mirrored", device="/cpu:0")
    message = str(info.value)
    assert "Unknown option(s) for strategy 'mirrored': device." in message
    assert "Expected: options of 'mirrored': devices, cross_device_ops." in message


def test_unknown_option_of_multi_worker_names_its_options():
    with pytest.raises(StrategyConfigError) as info:
        tfdist.strategies.get_strategy("multi_worker", communication="ring")
    assert ("options of 'multi_worker': implementation, bytes_per_pack, timeout_seconds, "
            "startup_timeout_seconds, tf_config") in str(info.value)


def test_register_refuses_duplicates_and_auto():
    with pytest.raises(StrategyConfigError, match="'mirrored' is already registered"):
        tfdist.strategies.register("mirrored", "x.y:Z")
    with pytest.raises(StrategyConfigError, match="other than 'auto'"):
        tfdist.strategies.register("auto", "x.y:Z")
    with pytest.raises(StrategyConfigError, match="'package.module:ClassName'"):
        tfdist.strategies.register("mine", "x.y.Z")


def test_register_and_resolve_a_new_name():
    tfdist.strategies.register("my_default", "tfdist.strategies.default:DefaultStrategy")
    try:
        assert "my_default" in tfdist.strategies.available_strategies()
        cls = tfdist.strategies.get_strategy_class("my_default")
        assert cls is tfdist.strategies.get_strategy_class("default")
    finally:
        registry._REGISTRY.pop("my_default")


def test_auto_logs_one_line_with_choice_and_reason(monkeypatch, caplog):
    for var in ("TF_CONFIG", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("tfdist.strategies.detect.local_gpu_count", lambda: 0)
    with caplog.at_level(logging.INFO, logger="tfdist"):
        strategy = tfdist.strategies.get_strategy("auto")
    lines = [r.getMessage() for r in caplog.records if r.name == "tfdist"]
    assert lines == [
        "tfdist chose strategy 'default': no TF_CONFIG, no Horovod rank, 0 local GPU(s)."
    ]
    assert strategy.name == "default"
