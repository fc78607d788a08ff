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
from tfdist.core.traits import MODEL_PARALLEL_ENV

pytestmark = [pytest.mark.multiprocess, pytest.mark.cold_start]  # peak RSS: not from a fork

SCRIPT = Path(__file__).parent / "scripts" / "pipeline_peak.py"
ENV = {**MALLOC_ENV, "TF_ENABLE_ONEDNN_OPTS": "0"}
"""Resident memory follows what is allocated (`MALLOC_ENV`), and what TensorFlow allocates for
the step, not oneDNN's cached copies of weights in its own layouts: with oneDNN on, an AMD EPYC
measured the last stage at 185-218 MB (stage 0 131, one process 195-199), off 147 (140, 201);
the Intel CPUs before, 148 with it on."""
SLACK = 80e6
"""Activations (tens of kB here), the step's small tensors and the traced step (measured: 30-35
MB above gradients + slots + one micro-batch's gradients, at M=1 as at M=8). The same commit's
stage 1 grew 146 to 178 MB in consecutive runs on 2026-11-27 (allocator noise of about 30 MB;
48 MB of slack failed one run in three), and 183 MB in a clean-clone run that night (64 MB of
slack failed it by 6 MB), hence 80 MB. The sabotage it catches (every micro-batch's gradients
kept) measured 351 MB, far above 4 x 28 + 80."""


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
WIDE_MLP = ("pipeline", "1536", "24", "4", "1f1b", "adam")
"""Issue 36's MLP: 57M parameters (227 MB of float32 weights), K=2, 1F1B, M=4, Adam (the weights
and Adam's two slots, 681 MB in one process, dominate the fixed costs)."""
RATIO = 0.6
"""Issue 36's bound. Two causes of runs above it are fixed: oneDNN's pooled allocator, which held
the last stage's high-water mark in doubling regions (CI on 2026-11-27: 594 MB against 475 for
stage 0 and 887 for one process, 0.67; pipeline tasks now get the system allocator,
`MODEL_PARALLEL_ENV`), and the whole-batch weight gradients computed while the step's last send
was pending, which `finish` then held all at once (a transient 542 MB against 452 in one run of
three; the weight pass now waits for the sends). After both, at load 8-24: stages 440-452 MB
against one process 840 (0.53-0.54), four runs with oneDNN on (three without the
sends change also stayed at 442-452: the transient is one run in several, not every run).

Before: Measured on 2026-11-27 at load 10-18 (2 cores): oneDNN off (two runs),
stages 446-447 / 454 MB against one process 842 (0.53 / 0.54); oneDNN on (its pooled allocator,
no ``TF_ONEDNN_USE_SYSTEM_ALLOCATOR`` needed), 476 / 482 against 878 (0.54 / 0.55), and 477 / 492
(0.54 / 0.56) in a run whose stages had the one-at-a-time change below; starting at load 1.6,
0.53 / 0.55 off and 0.55 / 0.55 on (both tests 149 s). The sabotage: summing
the micro-batches' gradients (``weight_gradients="sum"``, the default) measured 635 / 636 MB
against 842 (0.75 / 0.76), which this bound fails.

With SGD (no slots) the same model is at 0.62 / 0.64 (stages 182-190 MB against 296, load 12-18;
0.62-0.70 on a quiet machine; at 113M parameters, 48 layers, 0.56 / 0.59), and 0.6 is out of
reach for a reason of arithmetic, not of the schedule: a stage holds half the weights (119 MB
after the build) plus what any training process holds above them, which does not halve: 30-36 MB
the traced step and ``fit`` keep (one process: 30; a 12-layer model alone: 24) and 24-33 MB of
the step's temporaries (a layer's gradient and SGD's ``lr * g``, measured 24 MB with one inter-op
thread, 33 with two, in one process of 12 or 24 layers alike). 0.6 of 296 leaves a stage 58 MB
above its weights, less than one process's own 64. Two library changes measured on the stages made
no difference and were not kept: tying the step's sends to one gradient instead of all (stage 1
190 -> 187 MB, noise) and computing the weight gradients one at a time (control edges: stages
182 / 190 MB as before; in one process the step's temporaries went from 34-39 to 49-67 MB)."""


@pytest.mark.slow
@pytest.mark.parametrize("onednn", ["0", "1"], ids=["onednn_off", "onednn_on"])
def test_whole_batch_weight_gradients_keep_each_stage_near_half_of_one_process(cluster_runner,
                                                                              onednn):
    """Each stage's peak, from before the build to the end of 4 steps, at most `RATIO` of one
    process training the whole model, oneDNN off and on, and the same losses (within 1e-5).

    The stages run with the allocator a pipeline task gets (`MODEL_PARALLEL_ENV`); so does the
    one process, whose peak is then 20-40 MB lower than under oneDNN's pool (the harder bound)."""
    env = {**MALLOC_ENV, **MODEL_PARALLEL_ENV, "TF_ENABLE_ONEDNN_OPTS": onednn}
    single = cluster_runner(ClusterSpec.local(workers=1), PHASES, *WIDE_MLP, "--single",
                            env=env, timeout=600)["worker:0"]
    env = {**env, "TFDIST_STRATEGY": "pipeline", "TFDIST_PIPELINE_STAGES": "2"}
    stages = cluster_runner(ClusterSpec.local(workers=2), PHASES, *WIDE_MLP, "--whole-batch",
                            env=env, strategy="pipeline", timeout=600)
    print({task: (r["peak"] / 1e6, r["phases"]) for task, r in {**stages, "one": single}.items()})
    for result in stages.values():
        assert result["weight_bytes"] < 0.51 * single["weight_bytes"]
        assert result["peak"] <= RATIO * single["peak"], (result["peak"], single["peak"])
        assert result["loss"] == pytest.approx(single["loss"], rel=1e-5)
