"""Fixtures of the Horovod tests: skip cleanly without Horovod, and run a script on 2 ranks.

``horovod_run(script, *args, flavour=...)`` starts ``horovodrun -np 2 --gloo python script`` as one
task of `tfdist.testing.run_tasks` and returns the results that ranks 0 and 1 reported. The Keras
flavour is chosen in the child's environment (``TF_USE_LEGACY_KERAS``), before TF is imported.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
RANKS = 2
HOROVOD_IDLE = {"HOROVOD_CYCLE_TIME": "10"}
"""Horovod's background loop every 10 ms instead of every 1 (as in tests/bench/test_bench_smoke.py
and tests/examples/example_jobs.py): an idle rank then spends 0.02 CPU-s a second instead of
0.15-0.23, and a rank waits on the other most of its life on a loaded machine. The code that runs
and the sums (2 ranks) are the same; a collective may start up to 10 ms later."""


def _unavailable_reason() -> str | None:
    from tfdist.errors import MissingDependencyError
    from tfdist.horovod import runtime

    try:
        runtime.hvd()
    except MissingDependencyError as err:
        return f"horovod.tensorflow is not importable ({err.__cause__}); run: bash launch/setup.sh"
    return None


@pytest.fixture(autouse=True)
def _skip_without_horovod(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("horovod") is None:
        return
    reason = _unavailable_reason()
    if reason:
        pytest.skip(reason)
    if request.node.get_closest_marker("multiprocess") and shutil.which("horovodrun") is None:
        pytest.skip("horovodrun is not on PATH; put the venv's bin directory first on PATH")


@pytest.fixture
def horovod_run() -> Callable[..., tuple[dict[str, Any], dict[str, Any]]]:
    """Runs ``scripts/<script>`` on 2 Horovod ranks; returns (rank 0's, rank 1's) reports."""
    from tfdist.testing import run_tasks

    def run(script: str, *args: str, flavour: str = "keras3", controller: str = "gloo",
            timeout: float = 90) -> tuple[dict[str, Any], dict[str, Any]]:
        if controller == "mpi" and shutil.which("mpirun") is None:
            pytest.skip("OpenMPI's mpirun is not installed (bash launch/setup.sh installs it)")
        argv = ["horovodrun", "-np", str(RANKS), f"--{controller}", sys.executable,
                str(SCRIPTS / script), *args]
        # The caller's PYTHONPATH stays after the repo (e.g. a patched Horovod on trial).
        python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        env = {"PYTHONPATH": python_path, "TF_CPP_MIN_LOG_LEVEL": "2",
               "TF_USE_LEGACY_KERAS": "1" if flavour == "tf_keras" else "0", **HOROVOD_IDLE}
        results = run_tasks({"horovodrun": argv}, env={"horovodrun": env}, timeout=timeout)
        assert sorted(results) == ["rank:0", "rank:1"], f"ranks that reported: {sorted(results)}"
        return results["rank:0"], results["rank:1"]

    return run
