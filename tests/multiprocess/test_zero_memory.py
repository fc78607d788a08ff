"""ZeRO stage 3 lowers a process's peak memory, not only what it holds between steps: real
processes at D=2 train a 7.1M-parameter MLP (28 MB of float32 weights, layers of 9.4 MB) with
Adam, replicated (``multi_worker``) and at stage 3, which gathers each layer just before its
forward and its backward and reduce-scatters its gradient as it appears
(`tfdist.zero.layerwise`). Before, stage 3 gathered the whole model for the step: its peak was
the replicated one's (2.97 / 2.59 GB against 2.85 / 2.73 at 50M parameters)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfdist.bench.memory import MALLOC_ENV
from tfdist.cluster import ClusterSpec

pytestmark = [pytest.mark.multiprocess, pytest.mark.cold_start, pytest.mark.slow]

SCRIPT = Path(__file__).parent / "scripts" / "zero_memory.py"
ENV = {**MALLOC_ENV, "TF_ENABLE_ONEDNN_OPTS": "0", "TFDIST_STRATEGY": "multi_worker"}
"""Resident memory follows allocation (see tests/multiprocess/test_pipeline_memory.py)."""
MLP = ("1536", "3", "1")
"""width, square layers, steps after the first."""
RATIO = 0.8
"""Stage 3's peak above the TensorFlow runtime (826 MB here) against multi_worker's, process by
process. Measured at this size 0.58 and 0.65 (136 / 144 MB; load 14, 2026-11-27), and 0.63 /
0.59 (134 / 141 MB; load 6-8) once replicated trained on all its rows: about 100 MB
that the traced step and the runtime keep weigh on both; at 50M parameters 0.45-0.46 (636 / 656
MB against 1,407 / 1,417). The bound leaves the allocator's noise (about 30 MB)."""


def test_stage_three_peaks_below_replicated_and_holds_half_the_weights(cluster_runner):
    replicated = cluster_runner(ClusterSpec.local(workers=2), SCRIPT, "0", *MLP, env=ENV,
                                strategy="multi_worker", timeout=300)
    zero = cluster_runner(ClusterSpec.local(workers=2), SCRIPT, "3", *MLP, env=ENV,
                          strategy="multi_worker", timeout=300)
    print({(r["stage"], task): (r["peak"] / 1e6, r["phases"]) for job in (replicated, zero)
           for task, r in job.items()})
    chief = replicated["worker:0"]
    total = chief["total"]
    scalars = chief["held"]["slots"] - 2 * total  # Adam's iterations and learning rate
    assert chief["held"]["weights"] == total and 0 < scalars <= 16
    # The replicated processes hold the same and still differ by up to 16 MB after a step
    # (127.6 / 144.0 MB in a CI run, where stage 3's 108.1 missed worker:0's alone by 1.9 MB):
    # each stage-3 process is held against their mean.
    replicated_steady = (sum(r["phases"]["steady"]["rss"] for r in replicated.values())
                         / len(replicated))
    for task, result in zero.items():
        held = result["held"]
        assert result["units"] == 5  # every Dense gathered on its own
        assert held["weights"] == 0  # between steps, only the pieces
        # each layer cut in two: 1/D of the weights within one row of each layer
        assert abs(held["pieces"] - total / 2) <= 5 * 1536 * 4
        assert held["slots"] == 2 * held["pieces"] + scalars
        # what stays resident after a step: 1.5 x the weights less than replicated (its weights
        # and half its slots; before the per-layer cut, padding of whole layers stayed)
        assert result["phases"]["steady"]["rss"] <= replicated_steady - 0.75 * total
        ratio = result["peak"] / replicated[task]["peak"]
        print(f"{task}: stage 3 peak {result['peak'] / 1e6:.0f} MB, {ratio:.2f} of replicated")
        assert ratio <= RATIO, (task, result["peak"], [r["peak"] for r in replicated.values()])
    assert zero["worker:0"]["loss"] == zero["worker:1"]["loss"]
