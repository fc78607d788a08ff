"""D x K x T on a KerasHub model, real processes: GPT-2 (small config) at D=2 replicas x K=2
stages x T=2 shards (8 processes, M=2, 1F1B), each stage's Transformer block split inside
(attention by heads, the feed-forward pair by columns and rows; the tied embedding split by
vocabulary rows in stage 0, for the lookup, and in the last stage, whose logits are gathered
whole for the loss), each replica on its rows of the dict of inputs, trained with Adam on
batches of two sequence lengths (6 and 10: the stage's one trace serves both, its collectives
inside the blocks on sized keys; the tied embedding's row-sliced gradient, whose row count
follows the length, meets its replica on a key per size class) with a padding mask and sample
weights, ends within 1e-5 of one process on the same global batches and logs its losses;
predictions of both lengths; each process holds exactly its plan's bytes. Then the same job
trains a second model, GPT-2 with one row-split layer's all-reduce skipped inside a block in
each stage: parity breaks, and the second model trains at all (at D x K x T it once hung at its
first step: `tfdist.parallel.keys` counts the traced keys per group since). One launch; it
replaced the D=2 x K=2 one of `test_pipeline_hub.py`, the parity half of a K=2 x T=2 one, and
the K=2 x T=2 launch that trained the sabotage alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tfdist.cluster import ClusterSpec

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]  # 8 processes: 140 s at load 10
pytest.importorskip("keras_hub")

SCRIPT = Path(__file__).parent / "scripts" / "pipeline_hub.py"
PARITY_ATOL = 1e-5
PROCESSES = 8
TIED_SLICE_BYTES = 64 * 32 * 4 // 2
"""A shard of GPT-2's token embedding (vocabulary 64 x width 32, float32, split in two): held by
both stages (the same rows)."""


@pytest.fixture(scope="module")
def gpt2_kxt():
    from tfdist.cluster import release_ports
    from tfdist.testing import run_cluster

    spec = ClusterSpec.local(workers=PROCESSES)
    env = {"PYTHONPATH": str(SCRIPT.parents[3]), "TFDIST_STRATEGY": "pipeline",
           "TFDIST_PIPELINE_STAGES": "2", "TFDIST_TENSOR_SHARDS": "2",
           "TFDIST_MESH": "data=2,pipe=2,tensor=2"}
    try:
        return run_cluster(spec, SCRIPT, ["2", "gpt2", "--then-skip-row-reduce"], env=env,
                           strategy="pipeline", timeout=540)
    finally:
        release_ports(spec.ports())


def test_gpt2_blocks_split_inside_stages_match_one_process(gpt2_kxt):
    chief = gpt2_kxt["worker:0"]["models"]["gpt2"]
    print(f"gpt2 D=2 x K=2 x T=2: gap {chief['gap']:.2e}, moved {chief['moved']:.2e}, "
          f"{chief['seconds']:.0f} s")
    assert chief["moved"] > 1e-2, "training did not move the weights"
    assert chief["gap"] <= PARITY_ATOL
    for rank in range(PROCESSES):
        result = gpt2_kxt[f"worker:{rank}"]["models"]["gpt2"]
        np.testing.assert_allclose(result["loss"], chief["reference_loss"], atol=PARITY_ATOL)
        assert result["predicted_shapes"] == [[4, 6, 64], [4, 10, 64]]
    assert chief["predict_gap"] <= 1e-4, chief["predict_gap"]


def test_each_process_holds_its_shard_of_its_stages_blocks(gpt2_kxt):
    results = [gpt2_kxt[f"worker:{rank}"]["models"]["gpt2"] for rank in range(PROCESSES)]
    assert sorted((r["replica"], r["stage"], r["shard"]) for r in results) == [
        (d, k, t) for d in (0, 1) for k in (0, 1) for t in (0, 1)]
    plan = results[0]["plan"]
    kinds = {layer["name"]: layer["kind"] for layer in plan["layers"]}
    for block in ("transformer_layer_0", "transformer_layer_1"):
        assert kinds[f"{block}/self_attention/query"] == "column"
        assert kinds[f"{block}/self_attention/attention_output"] == "row"
        assert kinds[f"{block}/feedforward_intermediate_dense"] == "column"
        assert kinds[f"{block}/feedforward_output_dense"] == "row"
        checked = [layer["reason"] for layer in plan["layers"]
                   if layer["name"].startswith(block + "/") and layer["kind"] != "replicated"]
        assert checked and all("block checked" in reason for reason in checked)
    assert kinds["token_embedding"] == "tied"
    assert plan["split_bytes"] == 75008 and plan["whole_bytes"] == 78848  # 95.1%
    for r in results:  # the variables a process holds are what its plan says
        assert r["weight_bytes"] == r["held_bytes"], r
    for replica in (0, 1):  # a shard's two stages: the plan's bytes, its tied rows twice
        for shard in (0, 1):
            held = sum(r["held_bytes"] for r in results
                       if (r["replica"], r["shard"]) == (replica, shard))
            assert held == plan["bytes_per_process"] + TIED_SLICE_BYTES


def test_skipping_a_row_all_reduce_inside_a_block_breaks_parity(gpt2_kxt):
    """The job's second model (which at D x K x T once timed out at its first step)."""
    sabotage = gpt2_kxt["worker:0"]["sabotage"]
    assert sabotage["moved"] > 1e-2 and sabotage["gap"] > 1e-2, sabotage
