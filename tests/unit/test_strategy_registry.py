"""The registry: names, lazy entries, unknown names and options, and the "auto" log line."""

from __future__ import annotations

import logging
import re
import subprocess
import sys

import pytest

import tfdist.strategies
from tfdist.core import registry
from tfdist.errors import StrategyConfigError

pytestmark = pytest.mark.unit

BUILTINS = ("default", "mirrored", "multi_worker", "parameter_server", "horovod", "pipeline",
            "tensor", "auto")


def test_builtin_names():
    assert tfdist.strategies.available_strategies() == BUILTINS


def test_the_registry_docstring_names_every_built_in():
    """The module's own list of built-ins drifted once (pipeline and tensor were missing)."""
    names = registry.__doc__.split("Built-in names:", 1)[1].split("(chosen from", 1)[0]
    assert tuple(re.findall(r'``"(\w+)"``', names)) == BUILTINS


def test_traits_answer_without_importing_tensorflow_or_horovod():
    # The launcher, validation and the exports read traits; they must stay fast and work
    # where Horovod is not installed.
    code = ("import sys, tfdist.core.registry as r\n"
            "names = [n for n in r.available_strategies() if n != 'auto']\n"
            "print([r.strategy_traits(n).launch for n in names])\n"
            "print(sorted(m for m in ('tensorflow', 'horovod', 'keras') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == ["['single_process', 'single_process', 'tasks', 'tasks', 'ranks', 'tasks', "
                   "'tasks']",
                   "[]"]


@pytest.mark.parametrize("name", ["default", "mirrored", "multi_worker", "parameter_server",
                                  "pipeline", "tensor"])
def test_builtin_classes_carry_the_registry_s_traits(name):
    assert tfdist.strategies.get_strategy_class(name).traits is registry.strategy_traits(name)


def test_classes_are_tf_strategies_with_the_mixin():
    import tensorflow as tf

    from tfdist.strategies.base import TfdistStrategyMixin

    expected = {
        "default": tf.distribute.OneDeviceStrategy,
        "mirrored": tf.distribute.MirroredStrategy,
        "multi_worker": tf.distribute.MultiWorkerMirroredStrategy,
        "parameter_server": tf.distribute.experimental.ParameterServerStrategy,
        "pipeline": tf.distribute.OneDeviceStrategy,
        "tensor": tf.distribute.OneDeviceStrategy,
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
        "multi_worker, parameter_server, horovod, pipeline, tensor, auto, or "
        "'package.module:Class'. Fix: did you mean 'mirrored'? Or register your own with "
        "tfdist.strategies.register(), or "
        "name its class as 'package.module:Class', or declare it in the 'tfdist.strategies' "
        "entry-point group"
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
    monkeypatch.setattr("tfdist.core.detect.local_gpu_count", lambda: 0)
    with caplog.at_level(logging.INFO, logger="tfdist"):
        strategy = tfdist.strategies.get_strategy("auto")
    lines = [r.getMessage() for r in caplog.records if r.name == "tfdist"]
    assert lines == [
        "tfdist chose strategy 'default': no TF_CONFIG, no Horovod rank, 0 local GPU(s)."
    ]
    assert strategy.name == "default"
