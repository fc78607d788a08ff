"""Interleaved 1F1B in the engine with real processes: K=2 processes x v=2 chunks, M=4, Adam,
with regularizers: the reassembled weights, the loss, evaluate and predict equal one process
training the whole model on the same global batches; each process holds pieces k and k + K; the
saved model loads whole."""

from __future__ import annotations

import numpy as np
import pytest
from parity_checks import max_gap
from test_pipeline import CONTROL_MIN_GAP, PARITY_ATOL, SCRIPTS, loss_gap

from tfdist.cluster import ClusterSpec

pytestmark = pytest.mark.multiprocess


def test_two_processes_of_two_chunks_match_one_process(cluster_runner, tmp_path):
    env = {"TFDIST_STRATEGY": "pipeline", "TFDIST_PIPELINE_STAGES": "2",
           "TFDIST_PIPELINE_CHUNKS": "2"}
    results = cluster_runner(ClusterSpec.local(workers=2), SCRIPTS / "pipeline_parity.py",
                             "3", "4", "interleaved", "--adam", "--regularize", "--save",
                             str(tmp_path), env=env, strategy="pipeline", timeout=180)
    chief = results["worker:0"]
    assert max_gap(chief["trained"], chief["initial"]) > 0.02, "training did not move weights"
    assert max_gap(chief["trained"], chief["reference"]) <= PARITY_ATOL
    assert max_gap(chief["trained"], chief["control"]) > CONTROL_MIN_GAP
    for result in results.values():
        assert loss_gap(result, chief) <= PARITY_ATOL
        np.testing.assert_allclose(result["evaluate"], chief["reference_evaluate"], rtol=1e-5)
        np.testing.assert_allclose(result["predict"], chief["reference_predict"], atol=1e-5)
    reports = [results[f"worker:{k}"]["stage"] for k in range(2)]
    assert [r["pieces"] for r in reports] == [[0, 2], [1, 3]]
    assert sorted(name for r in reports for name in r["layers"]) == \
        ["d0", "d1", "d2", "d3", "d4", "out"]
    assert chief["reloaded"] is not None and max_gap(chief["reloaded"], chief["trained"]) == 0.0
