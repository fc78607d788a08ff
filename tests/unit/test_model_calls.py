"""Model calls that would not mean what they say are refused before they run, with the fix
(`tfdist.strategies.model_calls`; Keras 3). The runs that must work are in
``tests/examples/test_first_script.py``."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tfdist.core.flavour import keras_flavour
from tfdist.errors import StrategyConfigError

pytestmark = [pytest.mark.unit,
              pytest.mark.skipif(keras_flavour() != "keras3", reason="Keras 3's trainer")]

FIX = "model = strategy.build_model(build_fn)"


def build_fn():
    import keras

    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu",
                                                                    name="a"),
                             keras.layers.Dense(3, name="b")])


def data():
    x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64")


def compile_(model):
    import keras

    model.compile(optimizer="sgd",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


@pytest.fixture(params=["pipeline", "tensor"])
def model_parallel(request):
    from tfdist.strategies.pipeline import PipelineStrategy
    from tfdist.strategies.tensor import TensorStrategy

    return PipelineStrategy() if request.param == "pipeline" else TensorStrategy()


def test_a_model_made_whole_in_a_model_parallel_scope_is_refused_at_compile(model_parallel):
    with model_parallel.scope():
        model = build_fn()
        with pytest.raises(StrategyConfigError, match=r"must come from strategy\.build_model"
                           ) as refused:
            compile_(model)
    assert FIX in str(refused.value)
    assert "Sequential made in the" in str(refused.value)
    x, y = data()
    with pytest.raises(StrategyConfigError, match="model.fit would run all of it"):
        model.fit(x, y, epochs=1, verbose=0)  # compiled elsewhere or not: fit refuses too


def test_build_models_model_compiles_fits_and_validates(model_parallel):
    # the mark build_model leaves is what lets it through; validation_data under tensor once
    # failed with "'CallbackList' object is not iterable" (fit hands evaluate its own list)
    with model_parallel.scope():
        model = model_parallel.build_model(build_fn)
        compile_(model)
    x, y = data()
    history = model.fit(x, y, batch_size=8, epochs=1, validation_data=(x, y), verbose=0)
    assert np.isfinite(history.history["val_loss"][0])
    assert model.predict(x, batch_size=8, verbose=0).shape == (16, 3)


def test_multi_worker_refuses_validation_data_without_validation_steps():
    from tfdist.strategies import model_calls
    from tfdist.strategies.multi_worker import MultiWorkerMirroredStrategy

    class Stub:  # MultiWorkerMirroredStrategy's checks, without its collective runtime
        check_model_call = MultiWorkerMirroredStrategy.check_model_call

        def runs_locally(self, method, x=None):
            return False

    model = build_fn()
    compile_(model)
    model._distribute_strategy = Stub()
    model_calls.install()
    x, y = data()
    with pytest.raises(StrategyConfigError, match="needs validation_steps") as refused:
        model.fit(x, y, 8, 1, 0, None, 0.0, (x, y))  # validation_data given by position
    assert "pass validation_steps=N" in str(refused.value)
    assert "MultiWorkerMirroredStrategy" in str(refused.value)
    Stub().check_model_call(model, "fit", {"validation_data": (x, y), "validation_steps": 1})
    model._distribute_strategy = None


def test_a_pipeline_stage_refuses_model_x_when_it_holds_part_of_the_model():
    from tfdist.strategies.pipeline import PipelineStrategy

    strategy = PipelineStrategy()
    model = strategy.build_model(build_fn)
    x, _ = data()
    assert model(x).shape == (16, 3)  # one stage: the whole model
    model._engine = SimpleNamespace(layout=SimpleNamespace(stage=0, holds_all=False))
    model._pipeline = SimpleNamespace(stages=2)  # as stage 0 of 2 sees itself
    with pytest.raises(StrategyConfigError, match="this stage's activations") as refused:
        model(x)
    assert "call model.predict(x) on every process" in str(refused.value)


def test_evaluate_on_the_chief_alone_under_multi_worker_is_explained():
    # measured: `if strategy.is_chief: model.evaluate(...)` under --workers 2 failed with
    # TensorFlow's "tasks are unhealthy ... task:1 ... crashed" (worker 1 had exited normally)
    import tensorflow as tf

    from tfdist.cluster import Task
    from tfdist.strategies.multi_worker import MultiWorkerMirroredStrategy

    stub = SimpleNamespace(num_workers=2, task=Task("worker", 0), name="multi_worker",
                           collective_calls=MultiWorkerMirroredStrategy.collective_calls)
    explain = MultiWorkerMirroredStrategy.explain_failed_call
    gone = tf.errors.UnavailableError(None, None, "The following tasks are unhealthy (stopped "
                                      "sending heartbeats):\n/job:worker/replica:0/task:1")
    with pytest.raises(StrategyConfigError, match="called on one process alone") as explained:
        explain(stub, "evaluate", gone)
    assert "call model.evaluate on every process" in str(explained.value)
    assert explained.value.__cause__ is gone
    explain(stub, "fit", gone)  # a peer lost in fit is a failure, not this misuse
    explain(stub, "predict", gone)  # runs on each worker alone: never a collective
    explain(stub, "evaluate", tf.errors.UnavailableError(None, None, "connection reset"))


@pytest.mark.parametrize("name", ["pipeline", "tensor"])
def test_model_parallel_evaluate_and_predict_on_one_process_alone_are_explained(name):
    # measured: `if strategy.is_chief: model.predict(x)` under --strategy pipeline --stages 2
    # failed after 90 s with "tasks are unhealthy ... The tasks have crashed"
    import tensorflow as tf

    from tfdist.cluster import Task
    from tfdist.strategies.pipeline import PipelineStrategy
    from tfdist.strategies.tensor import TensorStrategy

    cls = PipelineStrategy if name == "pipeline" else TensorStrategy
    stub = SimpleNamespace(num_workers=2, task=Task("worker", 0), name=name,
                           collective_calls=cls.collective_calls)
    gone = tf.errors.UnavailableError(None, None, "The following tasks are unhealthy")
    for method in ("evaluate", "predict"):
        with pytest.raises(StrategyConfigError, match=f"model.{method} under {name} is a "
                           "collective of all 2 processes"):
            cls.explain_failed_call(stub, method, gone)
