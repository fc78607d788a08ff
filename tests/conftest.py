"""Shared fixtures: a multi-process cluster runner and marker-based skips.

Tests without a marker are treated as ``unit``. ``horovod`` tests skip (with the reason) when
Horovod is not built; run ``bash launch/setup.sh`` to build it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# Child processes must find the venv's tools (horovodrun) and import this checkout's tfdist.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Tests read every task's output (tfdist-launch --verbose); the tests of the launcher's default
# view (tests/multiprocess/test_launcher_output.py) unset it.
os.environ.setdefault("TFDIST_LAUNCH_VERBOSE", "1")


def _horovod_available() -> bool:
    return importlib.util.find_spec("horovod") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_horovod = pytest.mark.skip(reason="Horovod is not installed; run: bash launch/setup.sh")
    have_horovod = _horovod_available()
    for item in items:
        if not any(m.name in ("multiprocess", "horovod", "slow") for m in item.iter_markers()):
            item.add_marker(pytest.mark.unit)
        if "horovod" in item.keywords and not have_horovod:
            item.add_marker(skip_horovod)


@pytest.fixture
def cluster_runner(tmp_path: Path) -> Iterator[Callable[..., dict[str, Any]]]:
    """Runs a script once per task of a `ClusterSpec` and returns each task's reported result.

    Every child gets its own TF_CONFIG, the job has a timeout, a failing child is re-raised as
    `TaskFailedError` naming its task, and all children are killed before the fixture returns.

    Example:
        def test_two_workers(cluster_runner):
            spec = tfdist.ClusterSpec.local(workers=2)
            results = cluster_runner(spec, SCRIPTS / "train.py", timeout=90)
            assert results["worker:0"]["weights"] == results["worker:1"]["weights"]
    """
    from tfdist.cluster import release_ports
    from tfdist.testing import run_cluster

    specs = []

    def run(spec: Any, script: str | os.PathLike[str], *args: str, **kwargs: Any) -> dict[str, Any]:
        specs.append(spec)
        kwargs.setdefault("timeout", 120)
        env = {"PYTHONPATH": str(REPO_ROOT), **kwargs.pop("env", {})}
        return run_cluster(spec, script, args, env=env, **kwargs)

    yield run
    for spec in specs:
        release_ports(spec.ports())
