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
        "'optimizer_built_before_fit', 'parameter_server_fit', 'tf_keras_only_names']")


# ------------------------------------------------ TensorFlow's parameter-server guide, model.fit
PS_SCRIPT = Path(__file__).parent / "scripts" / "tf_guide_ps_fit.py"


def launch_ps(tmp_path: Path, env: dict[str, str], *args: str
              ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    """``tfdist-launch --ps 2 --workers 2 tf_guide_ps_fit.py WORKING_DIR ARGS``; the chief's
    report (None if it wrote none)."""
    (tmp_path / "rows").mkdir()
    environ = {**os.environ, "PYTHONPATH": str(REPO), **env}
    out = subprocess.run(
        [sys.executable, "-m", "tfdist.launcher.cli", "--ps", "2", "--workers", "2",
         "--timeout", "240", str(PS_SCRIPT), str(tmp_path), *args],
        env=environ, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    report = tmp_path / "chief.json"
    return out, json.loads(report.read_text()) if report.exists() else None


def rows_read(working_dir: Path) -> dict[int, set[int]]:
    """Input pipeline -> the rows it read (the script's probe files ``rows/PIPELINE_ROW``)."""
    found: dict[int, set[int]] = {}
    for path in (working_dir / "rows").iterdir():
        pipeline, row = path.name.split("_")
        found.setdefault(int(pipeline), set()).add(int(row))
    return found


@pytest.fixture(scope="module")
def keras3_ps_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    working_dir = tmp_path_factory.mktemp("ps-keras3")
    out, report = launch_ps(working_dir, FLAVOUR_ENV["keras3"])
    assert out.returncode == 0 and report is not None, out.stdout[-4000:]
    return working_dir, report


def test_keras3_ps_fit_trains_through_the_coordinator(keras3_ps_run):
    _, report = keras3_ps_run
    assert report["keras"] == "keras"
    loss, val_loss = report["history"]["loss"], report["history"]["val_loss"]
    assert len(loss) == len(val_loss) == 4
    assert loss[-1] < loss[0] / 5 and val_loss[-1] < val_loss[0]  # measured: /24, /2.4
    assert report["evaluate"] < loss[0] / 5
    assert report["devices"] == ["/job:ps/replica:0/task:0/device:CPU:0",
                                 "/job:ps/replica:0/task:1/device:CPU:0"]


def test_keras3_ps_each_worker_reads_its_own_shard(keras3_ps_run):
    working_dir, _ = keras3_ps_run
    found = rows_read(working_dir)
    assert sorted(found) == [0, 1]
    assert found[0] == set(range(0, 64, 2)) and found[1] == set(range(1, 64, 2))


def test_keras3_ps_callbacks_write_from_the_chief_only(keras3_ps_run):
    working_dir, report = keras3_ps_run
    events = sorted((working_dir / "log").rglob("events.out.tfevents.*"))
    assert {e.parent.name for e in events} == {"train", "validation"}
    assert {e.name.split(".")[-3] for e in events} == {str(report["pid"])}  # the chief pid
    assert (working_dir / "ckpt.keras").stat().st_size > 0  # ModelCheckpoint
    assert not (working_dir / "backup").exists() or not any((working_dir / "backup").iterdir())


def test_the_guides_dataset_creator_names_the_fix_under_keras3(tmp_path):
    out, report = launch_ps(tmp_path, FLAVOUR_ENV["keras3"], "datasetcreator")
    assert out.returncode != 0 and report is None
    assert "(tf.keras.utils.experimental.DatasetCreator) is tf-keras (Keras 2) only" in out.stdout
    assert "Fix: set TF_USE_LEGACY_KERAS=1" in out.stdout


def test_the_guide_as_written_trains_with_tf_keras(tmp_path):
    """tf-keras's own fit with the guide's DatasetCreator: TF gives every worker the same input
    context, so both read the whole dataset as pipeline 0 (tfdist's strategy shards it)."""
    out, report = launch_ps(tmp_path, FLAVOUR_ENV["tf_keras"], "datasetcreator")
    assert out.returncode == 0 and report is not None, out.stdout[-4000:]
    assert report["keras"] == "tf_keras"
    assert report["history"]["loss"][-1] < report["history"]["loss"][0] / 5
    assert rows_read(tmp_path) == {0: set(range(64))}


# ------------------------------------------------ a large table over 2 ps tasks under Keras 3
EMBEDDING_SCRIPT = Path(__file__).parent / "scripts" / "ps_embedding_spread.py"
TABLE_BYTES = 4096 * 32 * 4  # the script's VOCAB x DIM float32


@pytest.mark.parametrize("mode", ["partitioner", "split"])
def test_keras3_embedding_table_over_two_ps(tmp_path, mode):
    """TensorFlow's partitioner shards the table but Keras 3 cannot train it (the error says why
    and names the fix); two half tables, one per ps, train and spread the bytes evenly."""
    report = tmp_path / "report.json"
    out = subprocess.run(
        [sys.executable, "-m", "tfdist.launcher.cli", "--ps", "2", "--workers", "1",
         "--timeout", "200", str(EMBEDDING_SCRIPT), str(report), mode],
        env={**os.environ, "PYTHONPATH": str(REPO), **FLAVOUR_ENV["keras3"]}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240)
    assert out.returncode == 0 and report.exists(), out.stdout[-4000:]
    result = json.loads(report.read_text())
    assert result["keras"] == "keras"
    per_ps = result["bytes_per_ps"]
    assert sorted(per_ps) == ["0", "1"]  # measured: 262,212 / 262,208 and 262,272 / 262,148
    assert all(TABLE_BYTES / 2 <= b <= TABLE_BYTES / 2 + 1024 for b in per_ps.values()), per_ps
    if mode == "partitioner":
        assert "ShardedVariable' object has no attribute 'handle'" in result["error"]
        assert "split a large table into several layers" in result["error"]
    else:
        assert result["loss"][-1] < result["loss"][0] / 100, result["loss"]
