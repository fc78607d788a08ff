"""ZeRO stages 1 and 2 on the data axis of a D=2 x K=2 pipeline (4 processes, one launch,
`scripts/zero_pipeline.py`): an Embedding model (sparse gradients on stage 0), Adam with
``global_clipnorm`` (one norm over both stages and both parts of each) and sample weights
train to the weights one process reaches with Keras's own ``fit``; each process holds about
half its stage's Adam slots; skipping the all-gather after the update breaks parity; the model
saved whole reloads with the trained weights. The launcher and the strategy refuse what the
pipeline cannot run (stage 3, D=1, tensor-split stages, use_ema), naming the fix, and a backup
written with ZeRO is refused by a job without it (its layout names the stage)."""

from __future__ import annotations

import numpy as np
import pytest
from parity_checks import MIN_TRAVEL, max_gap

from tfdist.cluster import ClusterSpec

SCRIPT = __import__("pathlib").Path(__file__).parent / "scripts" / "zero_pipeline.py"
REPO = SCRIPT.parents[3]
PARITY_ATOL = 1e-6
"""Against one process on the same global batches."""
SABOTAGE_MIN_GAP = 1e-2
"""Skipping the all-gather leaves the stages' weights as they were."""
TASKS = [f"worker:{r}" for r in range(4)]


@pytest.fixture(scope="module")
def zero_pipeline_job(tmp_path_factory):
    from tfdist.cluster import release_ports
    from tfdist.testing import run_cluster

    folder = tmp_path_factory.mktemp("zero_pipeline")
    spec = ClusterSpec.local(workers=4)
    try:
        env = {"PYTHONPATH": str(REPO), "TFDIST_STRATEGY": "pipeline",
               "TFDIST_PIPELINE_STAGES": "2", "TFDIST_ZERO": "1"}
        return run_cluster(spec, SCRIPT, ["3", str(folder)], env=env, strategy="pipeline",
                           timeout=240)
    finally:
        release_ports(spec.ports())


@pytest.mark.multiprocess
@pytest.mark.parametrize("phase", ["zero1", "zero2"])
def test_each_stage_on_the_data_axis_equals_one_process(zero_pipeline_job, phase):
    chief = zero_pipeline_job["worker:0"]
    reference = chief["reference"]
    assert max_gap(reference, chief["initial"]) > MIN_TRAVEL
    result = chief["phases"][phase]
    gap = max_gap(result["weights"], reference)
    print(f"{phase}: gap {gap:.1e}, chief {result['cpu_seconds']:.1f} CPU-s")
    assert gap <= PARITY_ATOL
    for task in TASKS:  # the loss every process shows
        np.testing.assert_allclose(zero_pipeline_job[task]["phases"][phase]["loss"],
                                   chief["reference_loss"], atol=PARITY_ATOL)


@pytest.mark.multiprocess
def test_the_strategy_reads_the_stage_the_launcher_writes(zero_pipeline_job):
    chief = zero_pipeline_job["worker:0"]
    assert chief["class"] == "PipelineStrategy" and chief["zero_from_env"] == 1
    assert chief["layout"]["zero"] == 1 and chief["layout"]["data"] == 2


@pytest.mark.multiprocess
def test_skipping_the_all_gather_breaks_parity(zero_pipeline_job):
    chief = zero_pipeline_job["worker:0"]
    assert max_gap(chief["phases"]["sabotage"]["weights"], chief["reference"]) > \
        SABOTAGE_MIN_GAP


@pytest.mark.multiprocess
@pytest.mark.parametrize("phase", ["zero1", "zero2"])
def test_each_process_holds_about_half_its_stages_slots(zero_pipeline_job, phase):
    for task in TASKS:
        result = zero_pipeline_job[task]["phases"][phase]
        stage, replicated = result["stage_bytes"], result["replicated_slots"]
        scalars = replicated - 2 * stage  # Adam: two moments per weight, and its scalars
        assert 0 < scalars <= 16
        held = result["slots"] - scalars
        assert abs(held - stage) <= 0.1 * 2 * stage, (task, held, stage)  # 1/D of 2 x stage
        assert result["slots"] <= 0.6 * replicated


@pytest.mark.multiprocess
def test_the_model_saved_whole_reloads_with_the_trained_weights(zero_pipeline_job):
    chief = zero_pipeline_job["worker:0"]["phases"]["zero2"]
    assert chief["saved"] and chief["loaded"] is not None
    assert max_gap(chief["loaded"], chief["weights"]) == 0.0
    assert zero_pipeline_job["worker:1"]["phases"]["zero2"]["saved"] is None
