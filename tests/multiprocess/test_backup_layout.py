"""Two small tensor jobs of the same 2 processes, one launch each, read by two tests.

A backup records the layout it was written for: a tensor job's backup (D=1 x T=2) resumed
under another mesh (D=2 x T=1, same 2 processes) is refused on every rank before ``fit``, with
the flags that would resume it, and the backup is left as it was. That second launch then fits
a global batch of 9 rows over its D=2 replicas: every row trains (the 9th once never did:
``rows // D``), the logged loss and the weights equal one process's (it was a launch of its
own before). Two launches of 2 processes, one epoch of 2 steps each
(about 50 s).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tfdist.cluster import ClusterSpec

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).parent / "scripts" / "backup_layout.py"
PARITY_ATOL = 1e-5
"""float32, against the same model trained in one process."""


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """(backups, files after the first job, its results, the resumed job's results)."""
    from tfdist.cluster import release_ports
    from tfdist.testing import run_cluster

    backups = tmp_path_factory.mktemp("layout") / "backups"
    spec = ClusterSpec.local(workers=2)
    repo = str(SCRIPT.parents[3])

    def launch(shards: int) -> dict:
        env = {"PYTHONPATH": repo, "TFDIST_STRATEGY": "tensor",
               "TFDIST_TENSOR_SHARDS": str(shards)}
        return run_cluster(spec, SCRIPT, [str(backups)], env=env, strategy="tensor",
                           timeout=180)

    try:
        written = launch(2)
        files = sorted(str(p.relative_to(backups)) for p in backups.rglob("*") if p.is_file())
        return backups, files, written, launch(1)
    finally:
        release_ports(spec.ports())


def test_a_tensor_backup_is_refused_under_another_mesh(jobs):
    backups, files, written, resumed = jobs
    assert all("loss" in written[f"worker:{r}"] for r in range(2)), written
    assert "rank-0/layout.json" in files and "rank-1/layout.json" in files
    for rank in range(2):
        refused = resumed[f"worker:{rank}"].get("refused", "")
        assert "was written for another layout" in refused, resumed
        assert "data=1 (now 2)" in refused and "tensor=2 (now 1)" in refused
        assert "Fix: resume with the layout it was written for (--strategy tensor --workers 2 " \
               "--tensor 2)" in refused
    assert sorted(str(p.relative_to(backups)) for p in backups.rglob("*")
                  if p.is_file()) == files, "the refused job changed the backup"


def test_an_uneven_global_batch_trains_every_row_like_one_process(jobs):
    results = {task: result["uneven_rows"] for task, result in jobs[3].items()}
    chief = results["worker:0"]
    assert chief["reference_loss"][0] > 0.01, "the weighted row must carry a loss"
    assert chief["loss"][0] == pytest.approx(chief["reference_loss"][0], abs=PARITY_ATOL)
    assert chief["gap"] < PARITY_ATOL, chief
    assert results["worker:1"]["trained"] == chief["trained"], "the replicas diverged"
