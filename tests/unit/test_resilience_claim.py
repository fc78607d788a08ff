"""Backups claimed by one job, for one layout (`tfdist.resilience.claim`)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tfdist.errors import StrategyConfigError
from tfdist.resilience.claim import claim_backup, release_backup


class _Rank:
    """A strategy's process as `claim_backup` sees it."""

    per_rank_backups, is_chief = True, False

    def __init__(self, rank: int, layout: dict | None) -> None:
        self.worker_index, self._layout = rank, layout

    def backup_layout(self) -> dict | None:
        return self._layout


def _claim(directory, rank: int, layout: dict | None) -> None:
    claim_backup(_Rank(rank, layout), str(directory / f"rank-{rank}"), str(directory))


TENSOR_D1_T2 = {"strategy": "tensor", "processes": 2, "data": 1, "tensor": 2}
TENSOR_D2_T2 = {"strategy": "tensor", "processes": 4, "data": 2, "tensor": 2}


def test_a_backup_written_at_one_replica_is_refused_on_every_rank_of_two(tmp_path):
    # D=1 x T=2 wrote rank-0 and rank-1; --workers 4 (D=2) once resumed ranks 0-1 and started
    # ranks 2-3 afresh. Every rank of the new layout must refuse, also those with no backup.
    for rank in range(2):
        _claim(tmp_path, rank, TENSOR_D1_T2)
    for rank in range(4):
        with pytest.raises(StrategyConfigError) as refused:
            _claim(tmp_path, rank, TENSOR_D2_T2)
        message = str(refused.value)
        assert "rank-0's backup has data=1 (now 2), processes=2 (now 4)" in message
        assert ("Fix: resume with the layout it was written for (--strategy tensor --workers 2 "
                "--tensor 2)") in message
    assert not (tmp_path / "rank-2" / "layout.json").exists()
    assert json.loads((tmp_path / "rank-0" / "layout.json").read_text()) == TENSOR_D1_T2


def test_the_same_layout_resumes_and_a_pipeline_names_its_stages(tmp_path):
    _claim(tmp_path, 0, TENSOR_D1_T2)
    _claim(tmp_path, 0, TENSOR_D1_T2)  # the same process again (a second fit): its own lock
    pipeline = {"strategy": "pipeline", "processes": 2, "data": 1, "stages": 2, "tensor": 1,
                "chunks": 1, "stage_bounds": [0, 3, 6]}
    other = tmp_path / "pipeline"
    _claim(other, 1, pipeline)
    with pytest.raises(StrategyConfigError, match=r"stage_bounds=\[0, 3, 6\] \(now \[0, 2, 6\]\)"
                       r".*--strategy pipeline --workers 2 --stages 2\)"):
        _claim(other, 1, {**pipeline, "stage_bounds": [0, 2, 6]})
    _claim(other, 1, {**pipeline, "stage_bounds": None})  # not split yet: nothing to compare


def test_a_second_job_on_the_same_backup_directory_is_refused_while_the_first_runs(tmp_path):
    holder = textwrap.dedent(f"""
        import sys, time
        from tfdist.resilience.claim import claim_backup
        class Rank:
            per_rank_backups, is_chief, worker_index = True, True, 0
        claim_backup(Rank(), {str(tmp_path / 'rank-0')!r}, {str(tmp_path)!r})
        print("claimed", flush=True)
        sys.stdin.read()
        """)
    first = subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "claimed"
        with pytest.raises(StrategyConfigError, match=r"is in use by another running job.*"
                           r"Fix: give each job its own backup directory"):
            _claim(tmp_path, 0, None)
    finally:
        first.stdin.close()
        first.wait(timeout=30)
    _claim(tmp_path, 0, None)  # the first job ended: its lock went with it


def test_a_released_backup_leaves_nothing_and_can_be_claimed_again(tmp_path):
    # tf-keras deletes only its checkpoint files: a finished fit must leave no lock or record.
    _claim(tmp_path, 0, TENSOR_D1_T2)
    release_backup(str(tmp_path / "rank-0"))
    assert not (tmp_path / "rank-0").exists()
    _claim(tmp_path, 0, TENSOR_D2_T2)  # no record left: any layout starts afresh
