"""A backup records the layout it was written for: a tensor job's backup (D=1 x T=2) resumed
under another mesh (D=2 x T=1, same 2 processes) is refused on every rank before ``fit``, with
the flags that would resume it, and the backup is left as it was. Two launches of 2 processes,
one epoch of 2 steps (about 50 s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfdist.cluster import ClusterSpec

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).parent / "scripts" / "backup_layout.py"


def test_a_tensor_backup_is_refused_under_another_mesh(cluster_runner, tmp_path):
    backups = tmp_path / "backups"
    spec = ClusterSpec.local(workers=2)

    def launch(shards: int) -> dict:
        env = {"TFDIST_STRATEGY": "tensor", "TFDIST_TENSOR_SHARDS": str(shards)}
        return cluster_runner(spec, SCRIPT, str(backups), env=env, strategy="tensor",
                              timeout=180)

    written = launch(2)
    assert all("loss" in written[f"worker:{r}"] for r in range(2)), written
    files = sorted(str(p.relative_to(backups)) for p in backups.rglob("*") if p.is_file())
    assert "rank-0/layout.json" in files and "rank-1/layout.json" in files

    resumed = launch(1)
    for rank in range(2):
        refused = resumed[f"worker:{rank}"].get("refused", "")
        assert "was written for another layout" in refused, resumed
        assert "data=1 (now 2)" in refused and "tensor=2 (now 1)" in refused
        assert "Fix: resume with the layout it was written for (--strategy tensor --workers 2 " \
               "--tensor 2)" in refused
    assert sorted(str(p.relative_to(backups)) for p in backups.rglob("*")
                  if p.is_file()) == files, "the refused job changed the backup"
