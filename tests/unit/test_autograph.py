"""tfdist's own step code is not rewritten by AutoGraph (`tfdist.strategies.autograph`); a
user's code still is, where it would be without tfdist."""

from __future__ import annotations

import numpy as np
import pytest
from tensorflow.python.autograph.impl import api

from tfdist.core.flavour import get_keras
from tfdist.strategies.pipeline import PipelineStrategy


@pytest.fixture
def converted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``module:qualname`` of each function AutoGraph converts while the test runs."""
    modules: list[str] = []
    original = api._convert_actual

    def recording(entity, program_ctx):
        modules.append(f"{getattr(entity, '__module__', '')}:{entity.__qualname__}")
        return original(entity, program_ctx)

    monkeypatch.setattr(api, "_convert_actual", recording)
    return modules


def _user_loss(y, y_pred):
    return (y - y_pred) ** 2


def test_a_pipeline_custom_loop_step_converts_the_users_loss_and_no_tfdist_code(converted):
    keras = get_keras()
    strategy = PipelineStrategy(micro_batches=2)
    model = strategy.build_model(lambda: keras.Sequential(
        [keras.Input((2,)), keras.layers.Dense(3), keras.layers.Dense(1)]))
    step = strategy.train_step(model, _user_loss, keras.optimizers.SGD(0.1))
    loss = float(step(np.ones((4, 2), "float32"), np.zeros((4, 1), "float32")))
    assert np.isfinite(loss)
    assert f"{__name__}:_user_loss" in converted  # the user's loss: converted, as in any step
    # tfdist's: only the tf.function's own Python function (AutoGraph converts that one always)
    assert [m for m in converted if m.startswith("tfdist")] == [
        "tfdist.strategies.pipeline:PipelineStrategy.train_step.<locals>.step"], converted
