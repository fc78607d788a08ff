"""A pipeline stage's peak resident memory is what the schedule promises (real processes, K=2,
Adam, a 57 MB MLP): every stage, the last included, grows by less than one process training the
whole model, and by at most its gradients, optimizer slots, one micro-batch's gradients being
added and the activations in flight. Before the fix the last stage kept every micro-batch's
gradients (M=8: 351 MB against 148 MB now and 199 MB for one process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfdist.bench.memory import MALLOC_ENV
from tfdist.cluster import ClusterSpec

pytestmark = [pytest.mark.multiprocess, pytest.mark.cold_start]  # peak RSS: not from a fork

SCRIPT = Path(__file__).parent / "scripts" / "pipeline_peak.py"
ENV = {**MALLOC_ENV, "TF_ENABLE_ONEDNN_OPTS": "0"}
"""Resident memory follows what is allocated (`MALLOC_ENV`), and what TensorFlow allocates for
the step, not oneDNN's cached copies of weights in its own layouts: with oneDNN on, an AMD EPYC
measured the last stage at 185-218 MB (stage 0 131, one process 195-199), off 147 (140, 201);
the Intel CPUs before, 148 with it on."""
SLACK = 64e6
"""Activations (tens of kB here), the step's small tensors and the traced step (measured: 30-35
MB above gradients + slots + one micro-batch's gradients, at M=1 as at M=8). The same commit's
stage 1 grew 146 to 178 MB in consecutive runs on 2026-11-27 (allocator noise of about 30 MB;
48 MB of slack failed one run in three), hence 64 MB."""


def test_every_stage_peaks_below_one_process_and_within_the_schedule_budget(cluster_runner):
    single = cluster_runner(ClusterSpec.local(workers=1), SCRIPT, "1", "gpipe", "--single",
                            env=ENV, timeout=240)["worker:0"]
    env = {**ENV, "TFDIST_STRATEGY": "pipeline", "TFDIST_PIPELINE_STAGES": "2"}
    stages = cluster_runner(ClusterSpec.local(workers=2), SCRIPT, "8", "gpipe", env=env,
                            strategy="pipeline", timeout=240)
    print({task: (r["growth"] / 1e6, 4 * r["weight_bytes"] / 1e6 + SLACK / 1e6)  # with -s
           for task, r in {**stages, "one process": single}.items()})
    assert sorted(r["stage"] for r in stages.values()) == [0, 1]
    for result in stages.values():
        assert result["weight_bytes"] < 0.55 * single["weight_bytes"]
        # gradients + Adam's two slots + one micro-batch's gradients, + slack
        assert result["growth"] <= 4 * result["weight_bytes"] + SLACK, result
        assert result["growth"] < single["growth"], (result, single)


PHASES = Path(__file__).parent / "scripts" / "memory_phases.py"
WIDE_MLP = ("pipeline", "1536", "24", "4", "1f1b", "sgd")
"""The issue's MLP: 57M parameters (227 MB of float32 weights), K=2, 1F1B, M=4, SGD, where
summing the micro-batches' gradients cost a stage its advantage (the 6 x 3072-wide one: 0.87 of
one process; with whole-batch gradients 0.68-0.71)."""
RATIO = 0.72
"""Measured 0.60 and 0.62 (oneDNN off) on a loaded machine: above a stage's 113 MB of weights, a
layer or three of the step's temporaries and 40-50 MB that the traced step and ``fit`` keep, as one
process has above its 227 MB. At 113M parameters (48 layers) the same measure gave 0.56 and 0.59.
On a quiet machine (load 0.5, 2026-11-27) three runs gave 0.62-0.70 (stages 183-205 MB against
295): more of the step's ops run at once and their temporaries overlap; 0.66 failed CI."""


def test_whole_batch_weight_gradients_keep_each_stage_near_half_of_one_process(cluster_runner):
    """Each stage's peak, from before the build to the end of 4 steps, at most `RATIO` of one
    process training the whole model, and the same losses (within 1e-5)."""
    single = cluster_runner(ClusterSpec.local(workers=1), PHASES, *WIDE_MLP, "--single",
                            env=ENV, timeout=600)["worker:0"]
    env = {**ENV, "TFDIST_STRATEGY": "pipeline", "TFDIST_PIPELINE_STAGES": "2"}
    stages = cluster_runner(ClusterSpec.local(workers=2), PHASES, *WIDE_MLP, "--whole-batch",
                            env=env, strategy="pipeline", timeout=600)
    print({task: (r["peak"] / 1e6, r["phases"]) for task, r in {**stages, "one": single}.items()})
    for result in stages.values():
        assert result["weight_bytes"] < 0.51 * single["weight_bytes"]
        assert result["peak"] <= RATIO * single["peak"], (result["peak"], single["peak"])
        assert result["loss"] == pytest.approx(single["loss"], rel=1e-5)
