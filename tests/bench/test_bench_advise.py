"""The advise benchmark's arithmetic: per-global-batch times, median error, first-choice verdict."""

from __future__ import annotations

import pytest

from tfdist.advise import Candidate
from tfdist.bench import advise

pytestmark = pytest.mark.unit

EX = advise.Example("ctr", 256, "parameter_server")


def test_async_workers_share_fit_steps_so_a_global_batch_takes_batch_over_worker_batch_steps():
    report = {"chief:0": {"step_s": 0.01, "samples_per_step": 128}}
    assert advise._measured_step(Candidate("parameter_server", 2, ps=1), EX, report) == 0.02
    sync = {"worker:0": {"step_s": 0.01, "samples_per_step": 128}}
    assert advise._measured_step(Candidate("multi_worker", 2), EX, sync) == 0.01


def _row(example, candidate, rank, predicted, measured):
    return {"example": example, "candidate": candidate, "predicted_rank": rank,
            "predicted_ms": predicted, "measured_ms": measured,
            "error": predicted / measured - 1}


def test_summary_median_error_and_first_choice_within_ten_percent():
    rows = [_row("a", "x", 1, 10, 10.5), _row("a", "y", 2, 12, 10.0),    # 1st 5% slower: ok
            _row("b", "x", 1, 10, 20.0), _row("b", "y", 2, 11, 10.0)]    # 1st 2x slower: missed
    summary = advise.summarize(rows)
    assert summary["median_abs_error"] == pytest.approx(0.15)   # |errors| .05 .1 .2 .5
    verdict = summary["first_choice"]
    assert verdict["a"]["ok"] and verdict["a"]["first_over_fastest"] == pytest.approx(1.05)
    assert not verdict["b"]["ok"] and verdict["b"]["fastest"] == "y"
    assert [r["measured_rank"] for r in rows] == [2, 1, 2, 1]
    assert "b: first choice x, measured fastest y (MISSED, 2.00x)" in advise.note(summary)
