"""The pipeline gives one device's result for optimizers that see the gradients' form and all of
them at once (real processes, K=2): Adam with an Embedding (its gradient an ``IndexedSlices``
with repeated rows; densifying it, the control, changes Keras 3's result), and every Keras
optimizer option either matches one process or is refused before training, naming the option."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfdist.cluster import ClusterSpec

pytestmark = pytest.mark.multiprocess

SCRIPTS = Path(__file__).parent / "scripts"
PARITY_ATOL = 1e-5


def run_cases(cluster_runner, micro_batches, schedule, cases, flavour="keras3", extra=()):
    env = {"TFDIST_STRATEGY": "pipeline", "TFDIST_PIPELINE_STAGES": "2"}
    if flavour == "tf_keras":
        env["TF_USE_LEGACY_KERAS"] = "1"
    results = cluster_runner(ClusterSpec.local(workers=2), SCRIPTS / "pipeline_exact.py", "3",
                             str(micro_batches), schedule, *cases, *extra, env=env,
                             strategy="pipeline", timeout=240)
    assert results["worker:0"]["flavour"] == flavour
    return results


def assert_exact(result):
    assert "refused" not in result, result
    assert result["moved"] > 1e-2, "training did not move the weights"
    assert result["gap"] <= PARITY_ATOL, result
    assert result["loss_gap"] <= PARITY_ATOL, result


@pytest.mark.parametrize("micro_batches, schedule, flavour", [
    (1, "gpipe", "keras3"),
    (4, "1f1b", "keras3"),
    (4, "gpipe", "tf_keras"),
])
def test_adam_with_an_embedding_matches_one_process(cluster_runner, micro_batches, schedule,
                                                    flavour):
    results = run_cases(cluster_runner, micro_batches, schedule, ["adam", "sgd"], flavour,
                        ["--dense-control"] if flavour == "keras3" else [])
    chief = results["worker:0"]
    for case in ("adam", "sgd"):
        assert_exact(chief["cases"][case])
    if flavour == "keras3":  # the control: a densified gradient is measurably different
        assert chief["dense_gap"] > 1e-3
