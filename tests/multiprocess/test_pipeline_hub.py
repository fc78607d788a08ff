"""KerasHub models under the pipeline (K=2, M=2, 1F1B, real processes): their backbones leave
the sequence length out of ``keras.Input``, so the cut carries a hidden state ``(None, hidden)``
and the padding mask, and batches of two lengths train one after another (bucketed text: 6,
10, 6 tokens). GPT-2 (its embedding tied across the stages), Gemma and BERT (``keras.ops`` nodes
in their graphs) train to the weights of one process on the same global batches
(Adam, a padding mask with padded positions, sample weights) within 1e-5, and report its
losses, and predict a batch of each length as it does; the gradient across the cut dropped
misses by far more. Llama is refused before
training, naming its layer (KerasHub 0.32's decoder cannot give the config a stage rebuilds
from). One launch checks all of it. D > 1 on GPT-2 with two lengths (each replica's rows of the
dict of inputs; the tied embedding's sparse gradient meeting its replica on a key per size
class) is checked at D=2 x K=2 x T=2 in `test_pipeline_hub_tensor.py`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tfdist.cluster import ClusterSpec

pytestmark = pytest.mark.multiprocess
pytest.importorskip("keras_hub")

SCRIPT = Path(__file__).parent / "scripts" / "pipeline_hub.py"
PARITY_ATOL = 1e-5
TRAINED = ("gpt2", "gemma", "bert")
"""BERT has three inputs: its batch fingerprints take another named key than GPT-2's two in the
same job (`tfdist.parallel.consistency.assert_agree` offsets the key by the tensor count)."""


@pytest.fixture(scope="module")
def hub_pipeline(tmp_path_factory):
    from tfdist.cluster import release_ports
    from tfdist.testing import run_cluster

    spec = ClusterSpec.local(workers=2)
    env = {"PYTHONPATH": str(SCRIPT.parents[3]), "TFDIST_STRATEGY": "pipeline",
           "TFDIST_PIPELINE_STAGES": "2"}
    try:
        return run_cluster(spec, SCRIPT, ["2", *TRAINED, "llama", "--then-sabotage"], env=env,
                           strategy="pipeline", timeout=600)
    finally:
        release_ports(spec.ports())


@pytest.mark.parametrize("name", TRAINED)
def test_keras_hub_model_with_two_sequence_lengths_matches_one_process(hub_pipeline, name):
    chief = hub_pipeline["worker:0"]["models"][name]
    print(f"{name}: gap {chief['gap']:.2e}, moved {chief['moved']:.2e}, {chief['seconds']:.0f} s")
    assert chief["moved"] > 1e-2, "training did not move the weights"
    assert chief["gap"] <= PARITY_ATOL
    for rank in range(2):  # both stages report the whole pipeline's loss
        np.testing.assert_allclose(hub_pipeline[f"worker:{rank}"]["models"][name]["loss"],
                                   chief["reference_loss"], atol=PARITY_ATOL)
    # predictions on a batch of each length reach every stage (the last one shares them)
    assert chief["predict_gap"] <= 1e-4, chief["predict_gap"]
    other = hub_pipeline["worker:1"]["models"][name]
    assert other["predicted_sum"] == chief["predicted_sum"]
    lengths = [[4, 6, 64], [4, 10, 64]] if name != "bert" else [[4, 2], [4, 2]]  # logits
    assert chief["predicted_shapes"] == lengths


def test_dropping_the_gradient_across_the_cut_breaks_parity(hub_pipeline):
    sabotage = hub_pipeline["worker:0"]["sabotage"]
    assert sabotage["gap"] > 1e-2, sabotage


def test_a_model_whose_layers_cannot_give_their_config_is_refused_before_training(hub_pipeline):
    for rank in range(2):
        refusal = hub_pipeline[f"worker:{rank}"]["models"]["llama"]["refused"]
        assert "(LlamaTransformerDecoder) cannot be rebuilt from its config" in refusal
        assert "rope_scaling_factor" in refusal and "Fix: give LlamaTransformerDecoder" in refusal
