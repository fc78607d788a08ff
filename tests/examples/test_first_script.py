"""The guide's first script (``keras_examples/first_script.py``) runs unchanged under every
strategy, and its held-out ``evaluate`` and ``predict`` mean the same everywhere.

One launch per strategy under Keras 3, and Horovod under tf-keras too (2 processes where the
strategy has several; 2 epochs of a small MLP on scikit-learn's digits), every assertion on that
launch: the job exits 0; every process that runs the script reports the whole held-out set (288
rows from ``predict``, not its slice) and the same loss and accuracy as the others;
``predict``'s accuracy is ``evaluate``'s; and both are what one process computes from the saved
whole model (loaded here, with the Keras that trained it) on the same 288 rows. Measured on 2
busy cores (load 15): 10-30 s a launch; the module's first test also starts the warm server.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.examples.example_jobs import EXAMPLES, TF_KERAS, launch

pytestmark = pytest.mark.multiprocess

SCRIPT = str(EXAMPLES / "first_script.py")
HELD_OUT = slice(1509, None)  # the script's split: the last 288 of the 1,797 digits

TASKS = {  # the processes that run the script (parameter_server: the coordinator alone)
    "default": ["chief:0"],
    "mirrored": ["chief:0"],
    "multi_worker": ["worker:0", "worker:1"],
    "parameter_server": ["chief:0"],
    "horovod": ["rank:0", "rank:1"],
    "pipeline": ["worker:0", "worker:1"],
    "tensor": ["worker:0", "worker:1"],
    "horovod_tf_keras": ["rank:0", "rank:1"],  # tfdist's binding of the same calls for tf-keras
}


def one_process(model_path: Path, topology: str) -> tuple[float, float]:
    """(loss, accuracy) of the saved whole model on the held-out rows, in this process, with
    the Keras that trained it."""
    import importlib

    from sklearn.datasets import load_digits

    keras = importlib.import_module("tf_keras" if topology.endswith(TF_KERAS) else "keras")

    x, y = load_digits(return_X_y=True)
    x, y = (x[HELD_OUT] / 16.0).astype("float32"), y[HELD_OUT]
    logits = keras.models.load_model(model_path).predict(x, verbose=0)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, logits)
    return float(loss), float(np.mean(np.argmax(logits, axis=-1) == y))


@pytest.mark.parametrize("topology", list(TASKS))
def test_first_script_means_the_same_under(tmp_path, topology):
    model_dir = tmp_path / "model"
    status, output, results = launch(tmp_path, SCRIPT, topology, str(model_dir))
    assert status == 0, output[-4000:]
    assert sorted(results) == TASKS[topology], output[-4000:]
    first = results[TASKS[topology][0]]
    for task, result in results.items():
        assert result["strategy"] == topology.removesuffix(TF_KERAS)
        assert result["rows"] == 288, (task, result)  # the whole held-out set, not a slice
        assert result["accuracy"] == pytest.approx(first["accuracy"], abs=1e-6), results
        assert result["loss"] == pytest.approx(first["loss"], rel=1e-6), results
        assert result["predict_accuracy"] == pytest.approx(result["accuracy"], abs=1e-6)
    loss, accuracy = one_process(model_dir / "model.keras", topology)
    assert first["accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert first["loss"] == pytest.approx(loss, rel=1e-5)
    assert accuracy > 0.7, first  # 2 epochs; chance: 10%
