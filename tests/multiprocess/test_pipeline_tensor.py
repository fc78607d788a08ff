"""Pipeline stages split by tensor parallelism, with real processes (K=2 stages x T=2 shards,
4 processes; collectives over gRPC): a small Transformer LM cut between its blocks, each stage's
attention, feed-forward pair and embedding split over its 2 shards, trained with Adam by
``model.fit`` (M=2 micro-batches) and by the custom loop, ends with the weights and the logged loss
of one process training the whole model on the same global batches; skipping the row-split
layers' all-reduce breaks it; each process holds only its shard of its stage, and the weights a
stage's shards hold whole are the same on both; the saved model loads whole in one process. And
D=2 replicas of that (8 processes, 2 x 2 x 2: the gradients averaged over the data axis; 54 s
on 2 cores). A seeded build function gives every shard of every stage its part of what one
process draws."""

from __future__ import annotations

import numpy as np
import pytest
from parity_checks import max_gap
from test_tensor import (
    INITIAL_ATOL,
    NOISE_ATOL,
    PARITY_ATOL,
    SABOTAGE_MIN_GAP,
    gaps,
    phase,
    with_reference_of,
)

from tfdist.cluster import ClusterSpec

pytestmark = pytest.mark.multiprocess

SCRIPT = __import__("pathlib").Path(__file__).parent / "scripts" / "pipeline_tensor_parity.py"


MESH_ENV = {"TFDIST_STRATEGY": "pipeline", "TFDIST_PIPELINE_STAGES": "2",
            "TFDIST_TENSOR_SHARDS": "2", "TFDIST_MESH": "data=1,pipe=2,tensor=2"}


def run_3d(cluster_runner, *, args, replicas=1, timeout=300):
    env = {**MESH_ENV, "TFDIST_MESH": f"data={replicas},pipe=2,tensor=2"}
    spec = ClusterSpec.local(workers=4 * replicas)
    return cluster_runner(spec, SCRIPT, *args, env=env, strategy="pipeline", timeout=timeout)


def parity_gap(chief):
    """The largest gap to the reference beyond each element's share of its update
    (`test_tensor.UPDATE_RTOL`), the attention key biases (whose exact gradient is zero: float
    noise that Adam amplifies, see test_tensor.NOISE_ATOL) scaled to `PARITY_ATOL`."""
    weights, keys, worst = gaps(chief)
    print(f"gap to the reference: weights {weights:.2e} (largest: {worst}), key biases "
          f"{keys:.2e}")
    return max(weights, keys * PARITY_ATOL / NOISE_ATOL)


def check_parity(results):
    chief = results["worker:0"]
    assert max_gap(chief["trained"], chief["initial"]) > 0.02, "training did not move weights"
    assert parity_gap(chief) <= PARITY_ATOL
    for rank in range(len(results)):
        result = results[f"worker:{rank}"]
        np.testing.assert_allclose(result["loss"], chief["reference_loss"], atol=PARITY_ATOL)
        if "evaluate" in result:
            np.testing.assert_allclose(result["evaluate"], chief["reference_evaluate"],
                                       atol=PARITY_ATOL)
            np.testing.assert_allclose(result["predict"], chief["reference_predict"], atol=1e-4)


@pytest.fixture(scope="module")
def two_stages(tmp_path_factory):
    """One K=2 x T=2 job (M=2) checked three ways: ``fit`` (+ save), then the custom loop, then
    ``fit`` with a stage's row all-reduce skipped, each phase from the same initial weights
    (`pipeline_tensor_parity.py`'s ``--then-*``): one launch instead of three."""
    from tfdist.cluster import release_ports
    from tfdist.testing import run_cluster

    saved = tmp_path_factory.mktemp("saved")
    spec = ClusterSpec.local(workers=4)
    env = {"PYTHONPATH": str(SCRIPT.parents[3]), **MESH_ENV}
    try:
        results = run_cluster(spec, SCRIPT, ["3", "2", "--save", str(saved), "--then-custom-loop",
                                             "--then-sabotage"],
                              env=env, strategy="pipeline", timeout=400)
    finally:
        release_ports(spec.ports())
    return saved, results


def test_two_stages_of_two_shards_match_one_process(two_stages):
    tmp_path, results = two_stages
    check_parity(results)
    places = {(r["stage"], r["shard"]) for r in results.values()}
    assert places == {(0, 0), (0, 1), (1, 0), (1, 1)}
    kinds = {layer["name"]: layer["kind"] for layer in results["worker:0"]["plan"]["layers"]}
    assert kinds["tok_emb"] == "vocab" and kinds["b1_attn"] == "heads"
    assert (kinds["b1_ffn_in"], kinds["b1_ffn_out"]) == ("column", "row")
    assert kinds["lm_head"] == "replicated"  # the last stage's loss reads whole logits
    for stage in (0, 1):
        shards = [r for r in results.values() if r["stage"] == stage]
        assert shards[0]["replicated_digest"] == shards[1]["replicated_digest"]
        assert shards[0]["fn_bytes"] == shards[1]["fn_bytes"] == shards[0]["held_bytes"] \
            == shards[0]["report_bytes"]
    whole = results["worker:0"]["plan"]["whole_bytes"]
    assert sum(r["held_bytes"] for r in results.values()) < 0.6 * 2 * whole  # measured: 0.43
    chief = results["worker:0"]
    print(f"initial gap {chief['initial_gap']:.2e}")
    assert chief["initial_gap"] <= INITIAL_ATOL  # the seeded build function's draw
    assert chief["saved"] == str(tmp_path / "model.keras")
    assert max_gap(chief["reloaded"], chief["trained"]) == 0.0


def test_the_custom_loop_path_matches_one_process(two_stages):
    results = phase(two_stages[1], "custom-loop")
    assert "evaluate" not in results["worker:0"]  # the custom loop's own numbers, not fit's
    check_parity(results)


def test_skipping_a_stage_s_row_all_reduce_breaks_parity(two_stages):
    assert parity_gap(phase(two_stages[1], "sabotage")["worker:0"]) > SABOTAGE_MIN_GAP


def test_two_replicas_of_two_stages_of_two_shards_match_one_process(cluster_runner, two_stages):
    results = run_3d(cluster_runner, args=["3", "2", "--no-reference"], replicas=2, timeout=500)
    with_reference_of(results, two_stages[1])  # the same model, weights and batches
    places = {(r["replica"], r["stage"], r["shard"]) for r in results.values()}
    assert len(places) == 8
    print(f"initial gap {results['worker:0']['initial_gap']:.2e}")
    assert results["worker:0"]["initial_gap"] <= INITIAL_ATOL
    check_parity(results)
