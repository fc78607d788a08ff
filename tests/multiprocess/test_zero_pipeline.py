"""ZeRO stages 1, 2 and 3 on the data axis of a D=2 x K=2 pipeline and of a D=2 x T=2 tensor job
(4 processes each, one launch each, `scripts/zero_pipeline.py`): an Embedding model (sparse
gradients: pipeline stage 0; split by vocabulary under tensor, its dense layers split by
columns and rows), Adam with ``global_clipnorm`` (one norm over every stage or shard and every
part; or ``clipnorm``, each whole weight's, with weight decay and its exclusions) and sample
weights train to the weights one process reaches with Keras's own ``fit``;
each process holds about half its stage's (shard's) Adam slots; skipping the all-gather after
the update breaks parity; the model saved whole reloads with the trained weights. Stage 3 (the
same launches, after stages 1-2): each layer gathered (per micro-batch) for its forward and
backward; parity with ``global_clipnorm`` and with ``clipnorm`` + weight decay,
evaluate as one process, the stage's (shard's) variables empty between steps and each
process's parts half of them, and keeping each replica's own gradient (no reduce-scatter) breaks
parity; a per-process backup of stage 3, restored into a fresh model,
gives back each process's pieces and Adam variables, and its next epoch the uninterrupted
weights. What
they cannot run is refused before start (`tests/unit/test_zero_pipeline_options.py`)."""

from __future__ import annotations

import numpy as np
import pytest
from parity_checks import MIN_TRAVEL, max_gap

from tfdist.cluster import ClusterSpec

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]  # one launch each: 35-77 s under load

SCRIPT = __import__("pathlib").Path(__file__).parent / "scripts" / "zero_pipeline.py"
REPO = SCRIPT.parents[3]
PARITY_ATOL = 1e-6
"""Against one process on the same global batches."""
SABOTAGE_MIN_GAP = 1e-2
"""Skipping the all-gather leaves the stages' weights as they were."""
TASKS = [f"worker:{r}" for r in range(4)]
JOB_ENV = {"pipeline": {"TFDIST_MESH": "data=2,pipe=2,tensor=1", "TFDIST_PIPELINE_STAGES": "2"},
           "tensor": {"TFDIST_MESH": "data=2,pipe=1,tensor=2"}}
"""What ``tfdist-launch --workers 4 --stages 2`` (``--tensor 2``) writes on each task."""


@pytest.fixture(scope="module", params=["pipeline", "tensor"])
def zero_pipeline_job(request, tmp_path_factory):
    from tfdist.cluster import release_ports
    from tfdist.testing import run_cluster

    strategy = request.param
    folder = tmp_path_factory.mktemp(f"zero_{strategy}")
    spec = ClusterSpec.local(workers=4)
    try:
        env = {"PYTHONPATH": str(REPO), "TFDIST_STRATEGY": strategy,
               "TFDIST_ZERO": "1", **JOB_ENV[strategy]}
        result = run_cluster(spec, SCRIPT, ["3", str(folder)], env=env, strategy=strategy,
                             timeout=240)
        result["strategy"] = strategy
        return result
    finally:
        release_ports(spec.ports())


STAGE3_PHASES = ["zero3", "zero3_clipnorm"]


def _reference(chief, phase):
    return chief["reference"]["clipnorm" if "clipnorm" in phase else "global_clipnorm"]


@pytest.mark.parametrize("phase", ["zero1", "zero2", "zero1_clipnorm"])
def test_each_stage_on_the_data_axis_equals_one_process(zero_pipeline_job, phase):
    chief = zero_pipeline_job["worker:0"]
    reference, reference_loss = _reference(chief, phase)
    assert max_gap(reference, chief["initial"]) > MIN_TRAVEL
    result = chief["phases"][phase]
    gap = max_gap(result["weights"], reference)
    print(f"{zero_pipeline_job['strategy']} {phase}: gap {gap:.1e}, chief "
          f"{result['cpu_seconds']:.1f} CPU-s in fit")
    assert gap <= PARITY_ATOL
    for task in TASKS:  # the loss every process shows
        np.testing.assert_allclose(zero_pipeline_job[task]["phases"][phase]["loss"],
                                   reference_loss, atol=PARITY_ATOL)


def test_the_strategy_reads_the_stage_the_launcher_writes(zero_pipeline_job):
    chief = zero_pipeline_job["worker:0"]
    assert chief["class"] == f"{zero_pipeline_job['strategy'].title()}Strategy"
    assert chief["zero_from_env"] == 1
    assert chief["layout"]["zero"] == 1 and chief["layout"]["data"] == 2


def test_skipping_the_all_gather_breaks_parity(zero_pipeline_job):
    chief = zero_pipeline_job["worker:0"]
    assert max_gap(chief["phases"]["sabotage"]["weights"], _reference(chief, "sabotage")[0]) \
        > SABOTAGE_MIN_GAP


@pytest.mark.parametrize("phase", ["zero1", "zero2", "zero3"])
def test_each_process_holds_about_half_its_stages_slots(zero_pipeline_job, phase):
    for task in TASKS:
        result = zero_pipeline_job[task]["phases"][phase]
        stage, replicated = result["stage_bytes"], result["replicated_slots"]
        scalars = replicated - 2 * stage  # Adam: two moments per weight, and its scalars
        assert 0 < scalars <= 16
        held = result["slots"] - scalars
        assert abs(held - stage) <= 0.1 * 2 * stage, (task, held, stage)  # 1/D of 2 x stage
        assert result["slots"] <= 0.6 * replicated


def test_the_model_saved_whole_reloads_with_the_trained_weights(zero_pipeline_job):
    chief = zero_pipeline_job["worker:0"]["phases"]["zero2"]
    assert chief["saved"] and chief["loaded"] is not None
    assert max_gap(chief["loaded"], chief["weights"]) == 0.0
    assert zero_pipeline_job["worker:1"]["phases"]["zero2"]["saved"] is None


@pytest.mark.parametrize("phase", STAGE3_PHASES)
def test_stage3_on_the_data_axis_equals_one_process(zero_pipeline_job, phase):
    test_each_stage_on_the_data_axis_equals_one_process(zero_pipeline_job, phase)


def test_stage3_evaluates_and_saves_as_one_process(zero_pipeline_job):
    chief = zero_pipeline_job["worker:0"]
    result = chief["phases"]["zero3"]
    np.testing.assert_allclose(result["evaluated"], chief["reference_evaluated"], rtol=1e-5)
    assert result["saved"] and max_gap(result["loaded"], result["weights"]) == 0.0


def test_stage3_without_the_reduce_scatter_breaks_parity(zero_pipeline_job):
    chief = zero_pipeline_job["worker:0"]
    assert max_gap(chief["phases"]["sabotage3"]["weights"], _reference(chief, "zero3")[0]) \
        > SABOTAGE_MIN_GAP


def test_stage3_each_process_holds_half_its_stages_weights(zero_pipeline_job):
    job = zero_pipeline_job
    for task in TASKS:
        result = job[task]["phases"]["zero3"]
        held, stage = result["held"], result["stage_bytes"]
        print(f"{task}: stage {stage} B, between steps: weights {held['weights']} B, "
              f"parts {held['pieces']} B, largest layer {held['largest_layer']} B")
        assert held["weights"] == 0  # the stage model's variables hold no values
        assert abs(held["pieces"] - stage / 2) <= 0.1 * stage, (task, held, stage)
        assert held["largest_layer"] <= stage


RESUME_ATOL = 1e-7
"""A resumed job against the uninterrupted one (the same steps on the same processes)."""


def test_stage3_resumes_from_its_per_process_backups(zero_pipeline_job):
    """``zero3``'s per-process backup (at its epoch's end) resumed by a fresh model for a second
    epoch: each process's pieces and optimizer variables restored before any step are those
    saved (and not the fresh model's), and the epoch reaches the weights of ``zero3``'s model
    trained on for it without a stop."""
    for task in TASKS:
        saved = zero_pipeline_job[task]["phases"]["zero3"]["backup"]
        result = zero_pipeline_job[task]["phases"]["zero3_resume"]
        restored = result["restored"]
        assert max_gap(restored["pieces"], saved["pieces"]) == 0.0, task
        assert len(restored["slots"]) == len(saved["slots"]) > 2, task  # Adam's moments too
        assert max_gap(restored["slots"], saved["slots"]) == 0.0, task
        assert max_gap(result["before"], saved["pieces"]) > SABOTAGE_MIN_GAP, task
    chief = zero_pipeline_job["worker:0"]["phases"]
    gap = max_gap(chief["zero3_resume"]["weights"], chief["zero3"]["trained_on"])
    assert max_gap(chief["zero3"]["trained_on"], chief["zero3"]["weights"]) > SABOTAGE_MIN_GAP
    print(f"{zero_pipeline_job['strategy']} stage 3 resumed: gap {gap:.1e} to uninterrupted")
    assert gap <= RESUME_ATOL
