"""Tensor with D=2 replicas and a global batch of 9 rows: every row trains (the 9th once
never did: ``rows // D``), the logged loss and the weights equal one process's. One launch of 2
processes, 2 steps (about 25 s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfdist.cluster import ClusterSpec

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).parent / "scripts" / "tensor_uneven_rows.py"
PARITY_ATOL = 1e-5
"""float32, against the same model trained in one process."""


def test_an_uneven_global_batch_trains_every_row_like_one_process(cluster_runner):
    env = {"TFDIST_STRATEGY": "tensor", "TFDIST_TENSOR_SHARDS": "1"}
    results = cluster_runner(ClusterSpec.local(workers=2), SCRIPT, env=env, strategy="tensor",
                             timeout=180)
    chief = results["worker:0"]
    assert chief["reference_loss"][0] > 0.01, "the weighted row must carry a loss"
    assert chief["loss"][0] == pytest.approx(chief["reference_loss"][0], abs=PARITY_ATOL)
    assert chief["gap"] < PARITY_ATOL, chief
    assert results["worker:1"]["trained"] == chief["trained"], "the replicas diverged"
