"""``tfdist-bench --quick`` end to end: every section runs and reports sane numbers.

Not a timing assertion: the numbers must be positive and finite with the expected keys, so the
benchmark cannot rot unnoticed. Horovod parts run when Horovod is built, else they are left out.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path

import pytest

from tfdist.bench import cli

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(900)]

HAVE_HOROVOD = importlib.util.find_spec("horovod") is not None


def _positive_finite(row: dict, keys: tuple[str, ...]) -> None:
    for key in keys:
        value = row[key]
        assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, (key, row)


HOROVOD_IDLE = ["--env", "HOROVOD_CYCLE_TIME=10"]
"""Horovod's background loop, every 10 ms instead of every 1: an idle rank of 2 then spends 0.02
CPU-s a second, not 0.15-0.23 (measured: a 15 s sleep after ``hvd.init()``), and the 6 ranks of
this run live for minutes on a loaded machine. Which code runs is the same."""


def test_quick_run_writes_complete_results(tmp_path: Path) -> None:
    args = ["--quick", "--out", str(tmp_path), "--tag", "smoke", *HOROVOD_IDLE]
    if not HAVE_HOROVOD:
        args += ["--backends", "tf", "--strategies", "default,multi_worker"]
    assert cli.main(args) == 0

    [path] = tmp_path.glob("bench-*-quick-smoke.json")
    result = json.loads(path.read_text())
    assert result["machine"]["cores"] >= 1 and result["machine"]["versions"]["tensorflow"]
    backends = {"tf", "horovod"} if HAVE_HOROVOD else {"tf"}
    if HAVE_HOROVOD and shutil.which("mpirun"):
        backends.add("horovod-mpi")

    rows = result["allreduce"]["rows"]
    assert {r["backend"] for r in rows} == backends
    assert len(rows) == len(backends) * 3
    for row in rows:
        _positive_finite(row, ("bytes", "time_ms", "algbw_GBps", "busbw_GBps", "limit_GBps",
                               "busbw_over_limit", "copy_GBps"))
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"])  # N = 2: factor 2(N-1)/N = 1

    rows = result["train"]["rows"]
    expected = {("default", 1, "tfdist"), ("default", 1, "raw"), ("default", 1, "raw_control"),
                ("multi_worker", 2, "tfdist"), ("multi_worker", 2, "raw")}
    if HAVE_HOROVOD:
        expected |= {("horovod", 2, v) for v in ("tfdist", "tfdist_opt", "raw", "raw_control")}
    assert {(r["strategy"], r["replicas"], r["variant"]) for r in rows} == expected
    for row in rows:
        _positive_finite(row, ("samples_per_s", "fit_s"))
        assert (row["overhead"] is None) == (row["variant"] == "raw")
        if row["overhead"] is not None:
            assert math.isfinite(row["overhead"]) and row["overhead"] > -1
        if row["replicas"] > 1:
            _positive_finite(row, ("scaling_vs_default",))

    rows = result["ps"]["rows"]
    assert {(r["mode"], r["steps_per_execution"]) for r in rows} == {
        (m, s) for m in ("async PS", "sync multi-worker") for s in (1, 10)}
    for row in rows:
        _positive_finite(row, ("samples_per_s", "spe_speedup"))

    rows = result["pipeline"]["rows"]
    assert [(r["mode"], r["micro_batches"]) for r in rows] == [
        ("default", "-"), ("pipeline", 1), ("pipeline", 4), ("pipeline interleaved v=2", 4),
        ("multi_worker", "-")]
    for row in rows:
        _positive_finite(row, ("fit_step_s", "fit_call_s", "speedup_vs_default"))
    for row in rows[1:4]:
        _positive_finite(row, ("step_s", "ideal_s", "measured_over_ideal", "fit_over_loop"))
    for row in rows[1:3]:
        assert row["bubble"] == pytest.approx(1 / (row["micro_batches"] + 1))
    assert rows[3]["bubble"] == pytest.approx(1 / (2 * 4 + 1))  # (K-1)/(v M + K - 1)
    memory = result["pipeline"]["memory"]
    assert [(r["mode"], len(r["growth_mb"])) for r in memory] == [
        ("one process, whole model", 1), ("pipeline GPipe", 2), ("pipeline GPipe, recompute", 2)]
    for row in memory:
        assert all(math.isfinite(mb) and mb > 0 for mb in row["growth_mb"]), row

    assert Path(result["files"]["plot"]).stat().st_size > 0
    assert "| backend | size |" in (tmp_path / path.name.replace(".json", ".md")).read_text()
