"""`save_model` under the strategies that split the model (tensor; pipeline with its stage split
by tensor, K=1 x T=2): a path that cannot be written rescues the trained model and names where;
a save called on the chief only is refused within seconds with the fix, and so are
``evaluate`` and ``predict`` called on the chief only. One launch of 2 processes and 2 training
steps each (about 30 s)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tfdist.cluster import ClusterSpec

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).parent / "scripts" / "model_parallel_saves.py"
PARITY_ATOL = 1e-5
"""float32, against the same model trained in one process (measured: 6e-8)."""


@pytest.mark.parametrize("strategy", ["tensor", "pipeline"])
def test_a_bad_save_path_rescues_the_model_and_chief_only_saves_and_calls_are_refused(
        cluster_runner, tmp_path, strategy):
    env = {"TFDIST_STRATEGY": strategy, "TFDIST_TENSOR_SHARDS": "2"}
    results = cluster_runner(ClusterSpec.local(workers=2), SCRIPT, str(tmp_path), env=env,
                             strategy=strategy, timeout=180)
    chief = results["worker:0"]
    assert chief["saved_gap"] < PARITY_ATOL, chief
    to_directory = chief["to_directory"]
    assert "existing.keras' is a directory; the trained model was saved to" in to_directory
    assert "Fix: move the rescued model from" in to_directory
    assert chief["rescued_gap"] == 0.0
    shutil.rmtree(to_directory.split("saved to ", 1)[1].split(" ", 1)[0].rsplit("/", 1)[0])
    assert ("the process of rank 1 reached the end of the script (or failed) without calling "
            "it") in chief["chief_only"]
    assert "Fix: call strategy.save_model(model, path) on every process" in chief["chief_only"]
    assert chief["chief_only_s"] < 30, "refused only after a collective's deadline"
    for method in ("evaluate", "predict"):  # 85 s before, noticed by the peer's heartbeats
        refused = chief[f"chief_only_{method}"]
        assert f"model.{method} under {strategy} runs on every process" in refused
        assert ("the process of rank 1 reached the end of the script (or failed) without "
                "calling it") in refused
        assert f"Fix: call model.{method} on every process, not under `if strategy." in refused
        assert chief[f"chief_only_{method}_s"] < 10, (method, chief)
