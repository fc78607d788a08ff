"""D=2 x T=2 on a KerasHub model, real processes: GPT-2 (tiny config) under the tensor strategy
at 4 processes, 2 data replicas of 2 shards, each block split inside (attention by heads, the
feed-forward pair by columns and rows, the tied embedding by vocabulary rows). Global batches of
5 rows (the replicas hold 2 and 3) and of two sequence lengths (8 then 5: one trace, its
collectives on sized keys), Adam, a padding mask, sample weights: the gathered weights end
within 1e-5 of one process training the whole model on the same global batches (less 1e-3 of
each weight's update, `test_tensor.beyond_update_share`), every process logs the same loss and
holds its plan's bytes. Each replica applying its own gradients (no mean over the data axis)
breaks parity. One launch (``tensor_hub_parity.py --then-skip-data-average``)."""

from __future__ import annotations

import numpy as np
import pytest
from test_tensor import PARITY_ATOL, SABOTAGE_MIN_GAP
from test_tensor_hub import SCRIPT, gap

from tfdist.cluster import ClusterSpec

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]
pytest.importorskip("keras_hub")

PROCESSES = 4


@pytest.fixture(scope="module")
def replicas_job():
    from tfdist.cluster import release_ports
    from tfdist.testing import run_cluster

    spec = ClusterSpec.local(workers=PROCESSES)
    env = {"PYTHONPATH": str(SCRIPT.parents[3]), "TFDIST_STRATEGY": "tensor",
           "TFDIST_TENSOR_SHARDS": "2"}
    try:
        return run_cluster(spec, SCRIPT, ["2", "gpt2", "--global", "5",
                                          "--then-skip-data-average"],
                           env=env, strategy="tensor", timeout=560)
    finally:
        release_ports(spec.ports())


def test_gpt2_at_two_replicas_of_two_shards_matches_one_process(replicas_job):
    chief = replicas_job["worker:0"]
    assert (chief["replicas"], chief["shards"]) == (2, 2)
    result = chief["models"]["gpt2"]
    plan = result["plan"]
    kinds = {layer["name"]: layer["kind"] for layer in plan["layers"]}
    assert kinds["gpt2_backbone/token_embedding"] == "tied"
    assert kinds["gpt2_backbone/transformer_layer_0/feedforward_output_dense"] == "row"
    measured = gap(result, result)
    print(f"gpt2 D=2 x T=2: gap {measured:.2e}, seconds {result['seconds']}")
    assert measured <= PARITY_ATOL
    for rank in range(PROCESSES):
        mine = replicas_job[f"worker:{rank}"]["models"]["gpt2"]
        np.testing.assert_allclose(mine["loss"], result["reference_loss"], atol=PARITY_ATOL)
        assert mine["held_bytes"] == plan["bytes_per_process"]


def test_replicas_applying_their_own_gradients_break_parity(replicas_job):
    chief = replicas_job["worker:0"]
    measured = gap(chief["sabotage"], chief["models"]["gpt2"])
    assert measured > SABOTAGE_MIN_GAP, measured
