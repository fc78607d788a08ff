"""Scripts written for TensorFlow alone (no tfdist import) under ``tfdist-launch --workers 2``.

``scripts/tf_tutorial_multi_worker.py`` is TensorFlow's "Multi-worker training with Keras"
tutorial (the script makes its own MultiWorkerMirroredStrategy and calls ``model.fit``) and its
custom-training-loop tutorial, in one launch per Keras flavour. Keras 3 trains only because the
launcher's start-up hook (`tfdist.startup_hook`) installs the shims; with the hook off
(``TFDIST_STARTUP_HOOK=off``) the same job fails with keras#20585's PerReplica error. Each
launch is two TensorFlow processes (about 20 s on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from parity_checks import REFERENCE_ATOL, max_gap

pytestmark = pytest.mark.multiprocess

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "tf_tutorial_multi_worker.py"
FLAVOUR_ENV = {"keras3": {"TF_USE_LEGACY_KERAS": "0"}, "tf_keras": {"TF_USE_LEGACY_KERAS": "1"}}


def launch(tmp_path: Path, env: dict[str, str]
           ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``tfdist-launch --workers 2 SCRIPT``; what each worker wrote to TFDIST_RESULT_DIR."""
    results = tmp_path / "results"
    results.mkdir()
    environ = {**os.environ, "PYTHONPATH": str(REPO), "TFDIST_RESULT_DIR": str(results), **env}
    out = subprocess.run(
        [sys.executable, "-m", "tfdist.launcher.cli", "--workers", "2", "--timeout", "200",
         str(SCRIPT)],
        env=environ, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240)
    found = {p.stem: json.loads(p.read_text()) for p in results.glob("*.json")}
    return out, found


@pytest.fixture(scope="module", params=["keras3", "tf_keras"])
def tutorial_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                 ) -> tuple[str, dict[str, Any]]:
    out, found = launch(tmp_path_factory.mktemp(request.param), FLAVOUR_ENV[request.param])
    assert out.returncode == 0, out.stdout[-4000:]
    assert sorted(found) == ["worker_0", "worker_1"], out.stdout[-4000:]
    return request.param, found


def test_the_script_trains_with_the_keras_asked_for(tutorial_run):
    flavour, found = tutorial_run
    assert {r["keras"] for r in found.values()} == {"keras" if flavour == "keras3" else "tf_keras"}
    assert {r["num_replicas"] for r in found.values()} == {2}


@pytest.mark.parametrize("part", ["fit", "ctl"])
def test_replicas_are_identical_and_equal_one_process(tutorial_run, part):
    _, found = tutorial_run
    first, second = found["worker_0"], found["worker_1"]
    assert max_gap(first[part], second[part]) == 0.0
    assert max_gap(first[part], first[f"{part}_reference"]) <= REFERENCE_ATOL
    assert max_gap(first["fit"], first["fit_initial"]) > 5e-2, "training did not move weights"


def test_keras3_fails_as_released_without_the_hook(tmp_path):
    """Sabotage: the start-up hook off, Keras 3's own model.fit fails (keras#20585)."""
    out, found = launch(tmp_path, {**FLAVOUR_ENV["keras3"], "TFDIST_STARTUP_HOOK": "off"})
    assert out.returncode != 0 and not found
    assert "Attempt to convert a value (PerReplica" in out.stdout, out.stdout[-4000:]


def test_the_hook_installs_the_shims_when_keras_is_imported():
    """One process, hook on PYTHONPATH: nothing of TensorFlow at start, shims after import."""
    code = ("import sys; before = 'tensorflow' in sys.modules or 'keras' in sys.modules; "
            "import tensorflow as tf; from tfdist import compat; "
            "print(before, sorted(k for k, v in compat._installed.items() if v))")
    from tfdist.startup_hook import task_env

    env = {**os.environ, **FLAVOUR_ENV["keras3"], **task_env({"PYTHONPATH": str(REPO)})}
    out = subprocess.run([sys.executable, "-c", code], env=env, text=True, capture_output=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == (
        "False ['multi_worker_reduce_mean', 'multi_worker_symbolic_build', "
        "'parameter_server_fit']")
