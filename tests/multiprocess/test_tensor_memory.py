"""A tensor shard's peak resident memory against one process training the whole model (real
processes, T=2, Adam, KerasHub's GPT-2 at a size where the weights and Adam's two slots
dominate): issue 36's bound, at most `RATIO` of one process, from before the build (the whole
model built, broadcast, checked block by block and sliced in place) to the end of 4 steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfdist.bench.memory import MALLOC_ENV
from tfdist.cluster import ClusterSpec
from tfdist.core.traits import MODEL_PARALLEL_ENV

pytestmark = [pytest.mark.multiprocess, pytest.mark.cold_start,  # peak RSS: not from a fork
              pytest.mark.timeout(900)]  # 8 blocks: 334 s at load 8-17; 4 wider ones: 80 s at 1-3
pytest.importorskip("keras_hub")

PHASES = Path(__file__).parent / "scripts" / "memory_phases.py"
GPT2 = ("tensor", "1152", "4", "1", "gpipe", "adam", "--gpt2", "--rows", "16")
"""GPT-2 of 4 blocks of width 1152 (18 heads; 64M parameters, 257 MB of float32 weights;
vocabulary 512), next-token batches of 16 rows of 16 tokens, Adam. Until 2026-11-28 it was 8
blocks of 768 (57M parameters): as many weights in half the blocks trace half the step (a
block's forward, backward and Adam cost about 1,250 graph nodes, traced at ~0.7 ms each and
optimized at about as much again on the first call), and the test took 100 CPU-s, not 145
(one process: 31 CPU-s, not 47). Width 1088 (17 heads) leaves attention whole at T=2."""
RATIO = 0.6
"""Issue 36's bound. Measured on 2026-11-28 (2 cores, load 1-3), oneDNN on with the system
allocator, peaks read from the kernel's high-water mark (`tfdist.bench.memory.PeakSampler`):
shards 733 / 731 MB against one process 1313 (0.56 / 0.56), losses equal; the 8 blocks of 768
before: 737 / 739 against 1331 (0.55 / 0.56), on 2026-11-27 (load 8-17) 766 / 753 against 1329.

Where a shard's memory went, phase by phase (the same GPT-2 at 4 blocks, 28.8M parameters,
one process 742 MB): its peak was in the build, 477 / 474 MB (0.64), at the pre-training check
of the blocks (`tfdist.tensor.check`), 311 MB above the whole model: each block's T copies
stayed until Python's next collection (cycles of layers) and its gradients were compared as
float64 copies of all of them at once. Collected after each block, copied and sliced one shard
at a time, compared one pair at a time: 172 MB above it, the build's peak 336 / 338 MB, below
the step's. At 4 blocks the step's peak then is 0.61-0.62 of one process: a shard keeps 35 MB
more than half of one process after the build (14 MB the broadcast of the initial weights, 21
the check) and about 35 more after the first step (its step's collectives and checks), which
do not halve; at 8 blocks they weigh half as much. oneDNN off, before the fixes (4 blocks,
batches of 64 rows): 709 / 705 MB against 1094 (0.65 / 0.64). oneDNN off after them (8 blocks, at
load 4-8): 808 / 804 MB against 1325 (0.61 / 0.61), the shards' step 40 MB higher than with
oneDNN on, one process's the same: the bound is not met there, and the test does not run it."""


@pytest.mark.slow
def test_a_gpt2_shard_at_t2_peaks_below_its_share_of_one_process(cluster_runner):
    """Each shard's peak at most `RATIO` of one process's, oneDNN on with the allocator a tensor
    task gets (`MODEL_PARALLEL_ENV`; the one process under it too), and the same losses."""
    env = {**MALLOC_ENV, **MODEL_PARALLEL_ENV, "TF_ENABLE_ONEDNN_OPTS": "1"}
    single = cluster_runner(ClusterSpec.local(workers=1), PHASES, *GPT2, "--single",
                            env=env, timeout=600)["worker:0"]
    env = {**env, "TFDIST_STRATEGY": "tensor"}
    shards = cluster_runner(ClusterSpec.local(workers=2), PHASES, *GPT2, env=env,
                            strategy="tensor", timeout=600)
    print({task: (r["peak"] / 1e6, r["phases"]) for task, r in {**shards, "one": single}.items()})
    for result in shards.values():
        assert result["weight_bytes"] < 0.51 * single["weight_bytes"]
        assert result["peak"] <= RATIO * single["peak"], (result["peak"], single["peak"])
        assert result["loss"] == pytest.approx(single["loss"], rel=1e-5)
