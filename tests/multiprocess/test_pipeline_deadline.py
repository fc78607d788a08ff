"""A pipeline set no ``timeout_seconds`` no longer waits forever: a stage whose peer is alive but
never meets it fails the batch at its deadline (`tfdist.pipeline.keras_model.STEP_TIMEOUT`,
lowered to 5 s here: it covers the batch before the stall, 5 ms, not the first, which traces and
gets the start-up deadline), naming the deadline and the fix, instead of hanging (a D x K x T
job's second model once waited forever). One launch of 2 processes: 9 s alone (2.3 s of it
starting a warm server); 23 s with a 15 s deadline and the stuck stage outliving the launcher's
SIGTERM by its 5 s grace."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfdist.cluster import ClusterSpec
from tfdist.errors import STEP_DEADLINE_MARKER, TaskFailedError

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).parent / "scripts" / "pipeline_stall.py"
DEADLINE_SECONDS = 5


def test_a_stalled_stage_fails_its_peer_at_the_batch_deadline(cluster_runner):
    env = {"TFDIST_STRATEGY": "pipeline", "TFDIST_PIPELINE_STAGES": "2",
           "TFDIST_PIPELINE_MICRO_BATCHES": "2"}
    with pytest.raises(TaskFailedError) as failed:
        cluster_runner(ClusterSpec.local(workers=2), SCRIPT, str(DEADLINE_SECONDS), env=env,
                       strategy="pipeline", timeout=180)
    message = str(failed.value)
    print(message[-2000:])
    assert "Task(s) worker:1 did not join the step (alive: stuck?)" in message
    assert "TRAINED THROUGH THE STALL" not in message
    assert f"{STEP_DEADLINE_MARKER} of {DEADLINE_SECONDS} s" in message
    assert "pass timeout_seconds=... to the pipeline strategy" in message
    # Without the deadline stage 0 waits out the stall (120 s) and the job trains through it.
