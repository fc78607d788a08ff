"""Tensor parallelism with an unseeded ``Dropout`` in the replicated layers: the shards draw the
same masks, so the replicated LayerNorm weights stay identical (they once differed after 6
steps); with that agreement sabotaged they drift apart silently when the weight check is off,
and the check stops the job at its step 2 naming the process and the weights. One launch of 2
processes, three 6-step fits (about 35 s)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tfdist.cluster import ClusterSpec

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).parent / "scripts" / "tensor_dropout.py"


def gap(a: list[list[float]], b: list[list[float]]) -> float:
    return max(float(np.max(np.abs(np.subtract(x, y)))) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def results():
    from tfdist.cluster import release_ports
    from tfdist.testing import run_cluster

    spec = ClusterSpec.local(workers=2)
    env = {"PYTHONPATH": str(SCRIPT.parents[3]), "TFDIST_STRATEGY": "tensor",
           "TFDIST_TENSOR_SHARDS": "2"}
    try:
        return run_cluster(spec, SCRIPT, [], env=env, strategy="tensor", timeout=240)
    finally:
        release_ports(spec.ports())


def test_an_unseeded_dropout_keeps_the_replicated_weights_identical(results):
    first, second = results["worker:0"], results["worker:1"]
    print("agreed gap", gap(first["agreed"], second["agreed"]))
    assert gap(first["agreed"], second["agreed"]) == 0.0


def test_sabotaged_seeds_diverge_silently_without_the_check(results):
    first, second = results["worker:0"], results["worker:1"]
    print("silent gap", gap(first["silent"], second["silent"]))
    assert gap(first["silent"], second["silent"]) > 1e-4


def test_the_weight_check_stops_the_divergence_naming_process_step_and_weight(results):
    for task in ("worker:0", "worker:1"):
        message = results[task]["caught"]
        print(task, message)
        assert message is not None, task
        assert "do not hold the same replicated weights" in message
        assert "rank 1 (shard 1 of replica 0): norm/gamma" in message, message
        assert "] [2]" in message and "Fix: draw random numbers in layers" in message
