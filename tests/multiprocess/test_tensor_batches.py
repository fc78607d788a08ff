"""A tensor job whose shards are given different batches fails at its first step, naming the
input that differs and the fix (it once trained a different model silently: loss 0.846 against
0.005). One launch of 2 processes that stops at step 1 (about 25 s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfdist.cluster import ClusterSpec
from tfdist.errors import TaskFailedError

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).parent / "scripts" / "tensor_batches.py"


def test_shards_given_different_batches_fail_at_the_first_step(cluster_runner):
    env = {"TFDIST_STRATEGY": "tensor", "TFDIST_TENSOR_SHARDS": "2"}
    with pytest.raises(TaskFailedError) as failed:
        cluster_runner(ClusterSpec.local(workers=2), SCRIPT, env=env, strategy="tensor",
                       timeout=180)
    message = str(failed.value)
    assert "TRAINED ON DIFFERENT BATCHES" not in message
    assert "do not hold the same global batch" in message
    assert "then the step:] [rank 1 (shard 1 of replica 0): x] [1]" in message
    assert "Fix: seed the shuffle of the input (dataset.shuffle(n, seed=S)" in message
