"""`PipelineConfig`: one definition of the pipeline's settings, checked once, shared by the
launcher (which writes it into the tasks' environment) and the strategy (which reads it back)."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys

import pytest

from tfdist.errors import StrategyConfigError
from tfdist.pipeline import config as config_module
from tfdist.pipeline.config import (
    LAYER_COSTS_ENV,
    MICRO_BATCHES_ENV,
    SCHEDULE_ENV,
    STAGES_ENV,
    PipelineConfig,
)

pytestmark = pytest.mark.unit


def test_docstring_examples_run():
    result = doctest.testmod(config_module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_the_module_imports_no_tensorflow():
    code = ("import sys, tfdist.pipeline.config; "
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


def test_defaults_and_the_environment_round_trip():
    assert PipelineConfig() == PipelineConfig.from_env({})
    config = PipelineConfig(stages=3, micro_batches=2, schedule="1f1b")
    assert config.env() == {STAGES_ENV: "3", MICRO_BATCHES_ENV: "2", SCHEDULE_ENV: "1f1b"}
    assert PipelineConfig.from_env(config.env()) == config


def test_an_argument_wins_over_the_environment():
    environ = {STAGES_ENV: "4", MICRO_BATCHES_ENV: "8", SCHEDULE_ENV: "1f1b"}
    config = PipelineConfig.from_env(environ, stages=2, schedule="gpipe")
    assert (config.stages, config.micro_batches, config.schedule) == (2, 8, "gpipe")


@pytest.mark.parametrize("environ, words", [
    ({STAGES_ENV: "two"}, "$TFDIST_PIPELINE_STAGES is not valid. "
     "Received: TFDIST_PIPELINE_STAGES='two'. Expected: an int >= 1."),
    ({MICRO_BATCHES_ENV: "0"}, "$TFDIST_PIPELINE_MICRO_BATCHES is not valid."),
    ({SCHEDULE_ENV: "zigzag"}, "Unknown pipeline schedule. Received: schedule='zigzag'"),
])
def test_a_bad_variable_is_named_with_the_fix(environ, words):
    with pytest.raises(StrategyConfigError) as info:
        PipelineConfig.from_env(environ)
    assert words in str(info.value) and "Fix:" in str(info.value)


@pytest.mark.parametrize("kwargs, words", [
    ({"stages": 0}, "stages must be a positive int. Received: stages=0"),
    ({"stages": True}, "stages must be a positive int"),
    ({"micro_batches": 2.5}, "micro_batches must be a positive int"),
    ({"schedule": "zigzag"}, "Unknown pipeline schedule."),
    ({"split_points": "d1"}, "split_points must be a list of layer names. Received: 'd1'"),
    ({"devices": "/gpu:0"}, "devices must be a list of device names."),
    ({"timeout": -1}, "Invalid value for option 'timeout_seconds'."),
    ({"layer_costs": "/nonexistent/costs.json"}, "Cannot read layer costs from"),
])
def test_bad_arguments_are_refused_with_the_fix(kwargs, words):
    with pytest.raises(StrategyConfigError) as info:
        PipelineConfig(**kwargs)
    assert words in str(info.value) and "Fix:" in str(info.value)


def test_layer_costs_are_read_once_from_the_file(tmp_path, monkeypatch):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"layer_costs": [1.0, 2.5]}))
    monkeypatch.setenv(LAYER_COSTS_ENV, str(path))
    config = PipelineConfig.from_env()
    assert config.layer_costs == (1.0, 2.5)
    assert PipelineConfig.from_env(layer_costs=[3, 4]).layer_costs == (3, 4)
    assert LAYER_COSTS_ENV not in config.env()  # the user's own, never written


def test_normalised_values_and_replicas():
    config = PipelineConfig(stages=2, split_points=["d1"], devices=["/cpu:0", "/cpu:1"])
    assert config.split_points == ("d1",) and config.devices == ("/cpu:0", "/cpu:1")
    assert config.replicas(4) == 2
    with pytest.raises(StrategyConfigError, match="Fix: use --workers 4 \\(or 6\\)"):
        config.replicas(5)


def test_micro_batches_are_bounded_in_the_strategy_and_in_the_environment():
    from tfdist.pipeline.partition import MAX_MICRO_BATCHES

    assert PipelineConfig(stages=2, micro_batches=MAX_MICRO_BATCHES).micro_batches == 1024
    with pytest.raises(StrategyConfigError, match="at most 1024"):
        PipelineConfig(stages=2, micro_batches=MAX_MICRO_BATCHES + 1)
    with pytest.raises(StrategyConfigError, match="micro_batches=100000000000"):
        PipelineConfig.from_env({"TFDIST_PIPELINE_STAGES": "2",
                                 "TFDIST_PIPELINE_MICRO_BATCHES": "100000000000"})


def test_a_batch_smaller_than_its_micro_batches_names_how_many_fit():
    from tfdist.strategies.pipeline import PipelineStrategy

    strategy = PipelineStrategy(stages=1, micro_batches=16)
    with pytest.raises(StrategyConfigError, match="use at most 8 micro-batches"):
        strategy.check_rows(8)
    strategy.check_rows(32)
