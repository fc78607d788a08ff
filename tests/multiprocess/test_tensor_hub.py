"""KerasHub models under the tensor strategy, split inside their blocks: GPT-2 (tied embedding,
``CachedMultiHeadAttention``), Llama (grouped-query attention, gated feed-forward, untied
output embedding) and Gemma (its own attention layout, a gated feed-forward of ``EinsumDense``)
at T=2 train to the weights of one process training the whole model on the
same global batches (Adam, a padding mask, sample weights); skipping the row-split layers'
all-reduce across processes breaks it; each process holds about half the weights; the saved
model (gathered whole) reloads with the trained weights. One launch checks the three models, the
saving and the sabotage."""

from __future__ import annotations

import numpy as np
import pytest
from parity_checks import max_gap
from test_tensor import NOISE_ATOL, PARITY_ATOL, SABOTAGE_MIN_GAP, beyond_update_share

from tfdist.cluster import ClusterSpec

pytestmark = pytest.mark.multiprocess
pytest.importorskip("keras_hub")

SCRIPT = __import__("pathlib").Path(__file__).parent / "scripts" / "tensor_hub_parity.py"
REPO = SCRIPT.parents[3]
MODELS = ("gpt2", "llama", "gemma")


@pytest.fixture(scope="module")
def hub_job(tmp_path_factory):
    from tfdist.cluster import release_ports
    from tfdist.testing import run_cluster

    saved = tmp_path_factory.mktemp("saved") / "gpt2.keras"
    spec = ClusterSpec.local(workers=2)
    env = {"PYTHONPATH": str(REPO), "TFDIST_STRATEGY": "tensor", "TFDIST_TENSOR_SHARDS": "2"}
    try:
        return run_cluster(spec, SCRIPT, ["3", *MODELS, "--save", str(saved),
                                          "--then-from-function", "--then-sabotage"],
                           env=env, strategy="tensor", timeout=400)
    finally:
        release_ports(spec.ports())


def gap(result, reference):
    """The largest gap to the reference (less 1e-3 of each element's update), the attention
    key biases (whose exact gradient is zero: float noise, see `test_tensor.NOISE_ATOL`)
    scaled to `PARITY_ATOL`."""
    names = [w["name"] for layer in result["plan"]["layers"] for w in layer["weights"]]
    gaps = {}
    for name, trained, want, initial in zip(names, result["trained"], reference["reference"],
                                            reference["initial"], strict=True):
        scale = PARITY_ATOL / NOISE_ATOL if "key/bias" in name else 1.0
        gaps[name] = beyond_update_share(trained, want, initial) * scale
    worst = max(gaps, key=gaps.__getitem__)
    print(f"largest gap {gaps[worst]:.2e}: {worst}")
    return gaps[worst]


@pytest.mark.parametrize("name", MODELS)
def test_keras_hub_model_at_two_shards_matches_one_process(hub_job, name):
    chief = hub_job["worker:0"]["models"][name]
    plan = chief["plan"]
    split = {layer["name"]: layer["kind"] for layer in plan["layers"]}
    assert plan["split_bytes"] >= 0.95 * plan["whole_bytes"], plan
    assert split[f"{name}_backbone/token_embedding"] == "tied"
    reasons = [layer["reason"] for layer in plan["layers"] if layer["kind"] != "replicated"]
    assert any("block checked" in reason for reason in reasons), reasons
    assert max_gap(chief["trained"], chief["initial"]) > 0.02, "training did not move weights"
    measured = gap(chief, chief)
    print(f"{name}: gap to the reference {measured:.2e}, seconds {chief['seconds']}")
    assert measured <= PARITY_ATOL
    for rank in range(2):
        result = hub_job[f"worker:{rank}"]["models"][name]
        np.testing.assert_allclose(result["loss"], chief["reference_loss"], atol=PARITY_ATOL)
        assert result["held_bytes"] == plan["bytes_per_process"]
        assert result["held_bytes"] <= 0.55 * plan["whole_bytes"]


def test_skipping_an_all_reduce_inside_the_blocks_breaks_parity(hub_job):
    chief = hub_job["worker:0"]
    assert gap(chief["sabotage"], chief["models"][MODELS[0]]) > SABOTAGE_MIN_GAP


def test_the_saved_keras_hub_model_reloads_whole_with_the_trained_weights(hub_job):
    chief = hub_job["worker:0"]["models"][MODELS[0]]
    assert chief["saved"].endswith("gpt2.keras") and \
        hub_job["worker:1"]["models"][MODELS[0]]["saved"] is None
    assert max_gap(chief["reloaded"], chief["trained"]) == 0.0


def test_built_from_a_function_each_process_holds_slices_of_rank_0s_draw(hub_job):
    # each process draws the whole model with its own seed; gathered back, the shards are
    # rank 0's draw exactly (a shard sliced from its own draw would differ by ~0.1)
    assert hub_job["worker:0"]["from_function"]["gap_to_own_draw"] == 0.0
    for rank in range(2):
        built = hub_job[f"worker:{rank}"]["from_function"]
        assert built["held_bytes"] == built["bytes"]
