"""A pipeline job whose stages are given different batches fails at its first step, naming the
stage whose batch differs from stage 0's, what differs and the fix (it once trained stage 0's x
against stage 1's y silently: loss 4.70 against 0.036). One launch of 2 processes that stops at
step 1 (about 25 s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfdist.cluster import ClusterSpec
from tfdist.errors import TaskFailedError

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).parent / "scripts" / "pipeline_batches.py"


def test_stages_given_different_batches_fail_at_the_first_step(cluster_runner):
    env = {"TFDIST_STRATEGY": "pipeline", "TFDIST_PIPELINE_STAGES": "2",
           "TFDIST_PIPELINE_MICRO_BATCHES": "2"}
    with pytest.raises(TaskFailedError) as failed:
        cluster_runner(ClusterSpec.local(workers=2), SCRIPT, env=env, strategy="pipeline",
                       timeout=180)
    message = str(failed.value)
    print(message[-1500:])
    assert "TRAINED ON DIFFERENT BATCHES" not in message
    assert "do not hold the same global batch" in message
    assert ("then the step:] [rank 1 (stage 1 of replica 0): x rank 1 (stage 1 of replica 0): "
            "y] [1]") in message
    assert "Fix: seed the shuffle of the input (dataset.shuffle(n, seed=S)" in message
