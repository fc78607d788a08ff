"""How the examples' tests run a job and check what every run must show (no tests here).

`launch` runs an example through ``tfdist-launch`` and collects each task's JSON result;
`check_run` checks a fresh run: its summary (replicas as the strategy implies), that the chief
alone printed it, that exactly one model was saved (``<model-dir>/model.keras``; no temporary
copies, no backups left) and, for the ``model.fit`` examples, the chief's TensorBoard curve.
`launch_restarted` runs a job that crashes after epoch `RESTART_AFTER_EPOCH`
(``TFDIST_EXAMPLE_CRASH_AFTER_EPOCH``, see ``keras_examples/common.py``) and is restarted once
by the launcher; `check_restarted_run` checks it as `check_run` checks a fresh one, but for the
epochs: the restarted run runs only the remaining ones.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "keras_examples"
CRASH_ENV = "TFDIST_EXAMPLE_CRASH_AFTER_EPOCH"
CRASH_EXIT_STATUS = 42  # keras_examples/common.py
CHIEF_TASKS = ("chief:0", "worker:0", "rank:0")
WARM_PREIMPORT = "sklearn.datasets,sklearn.metrics"
"""What the examples import besides TensorFlow: their tasks' warm server imports it once
(tests/warm_start.py)."""
HOROVOD_IDLE = {"HOROVOD_CYCLE_TIME": "10"}
"""Horovod's background loop every 10 ms instead of every 1 (as in tests/bench/test_bench_smoke.py):
an idle rank then spends 0.02 CPU-s a second instead of 0.15-0.23, and a rank is idle most of a
job's life on a loaded machine. The code that runs and the sums (2 ranks) are the same."""

# Launcher arguments and expected num_replicas_in_sync of each topology (CPU: one replica per
# worker; ParameterServer steps run on one worker at a time: 1).
TOPOLOGIES: dict[str, tuple[list[str], int]] = {
    "default": (["--strategy", "default", "--workers", "1"], 1),
    "mirrored": (["--strategy", "mirrored", "--workers", "1"], 1),
    "multi_worker": (["--strategy", "multi_worker", "--workers", "2"], 2),
    "parameter_server": (["--strategy", "parameter_server", "--ps", "1", "--workers", "2"], 1),
    "parameter_server_2ps": (["--strategy", "parameter_server", "--ps", "2", "--workers", "2"], 1),
    "horovod": (["--strategy", "horovod", "--workers", "2"], 2),
    "horovod_mpi": (["--strategy", "horovod", "--workers", "2", "--mpi"], 2),
    "pipeline": (["--strategy", "pipeline", "--stages", "2", "--workers", "2",
                  "--micro-batches", "4"], 1),
    "pipeline_hybrid": (["--stages", "2", "--workers", "4", "--micro-batches", "2"], 2),
    "tensor": (["--strategy", "tensor", "--tensor", "2", "--workers", "2"], 1),
}
TF_KERAS = "_tf_keras"
"""A topology name ending in this runs with tf-keras (TF_USE_LEGACY_KERAS=1); others Keras 3."""
TOPOLOGIES.update({name + TF_KERAS: value for name, value in list(TOPOLOGIES.items())
                   if name not in ("default", "tensor")})  # tensor: Keras 3 only


def launch(tmp_path: Path, script: str, topology: str, *script_args: str,
           env: dict[str, str] | None = None, launcher_args: tuple[str, ...] = (),
           timeout: float = 240) -> tuple[int, str, dict[str, Any]]:
    """Runs an example through the launcher; returns (status, output, results by task)."""
    results = tmp_path / "results"
    results.mkdir(exist_ok=True)
    child_env = {**os.environ, "PYTHONPATH": str(REPO), "TFDIST_RESULT_DIR": str(results),
                 "TF_CPP_MIN_LOG_LEVEL": "3", "TFDIST_TEST_WARM_PREIMPORT": WARM_PREIMPORT,
                 **HOROVOD_IDLE, **(env or {})}
    child_env.pop("TF_USE_LEGACY_KERAS", None)
    if topology.endswith(TF_KERAS):
        child_env["TF_USE_LEGACY_KERAS"] = "1"
    argv, _ = TOPOLOGIES[topology]
    command = [sys.executable, "-m", "tfdist.launcher.cli", "--timeout", str(timeout), *argv,
               *launcher_args, str(EXAMPLES / script), *script_args]
    proc = subprocess.run(command, cwd=REPO, env=child_env, capture_output=True, text=True,
                          timeout=timeout + 30)
    found = {}
    for path in results.glob("*.json"):
        role, _, index = path.stem.rpartition("_")
        found[f"{role}:{index}"] = json.loads(path.read_text())
    return proc.returncode, proc.stdout + proc.stderr, found


def chief_summary(status: int, output: str, results: dict[str, Any]) -> dict[str, Any]:
    """The chief's summary, after checking the job succeeded and printed exactly one summary."""
    assert status == 0, output[-4000:]
    chiefs = [results[t] for t in CHIEF_TASKS if t in results]
    assert len(chiefs) == 1, f"expected one chief result, got {sorted(results)}"
    printed = [line for line in output.splitlines() if '{"strategy": ' in line]
    assert len(printed) == 1, f"the chief alone prints the summary; got {printed}"
    summary = chiefs[0]
    print(json.dumps(summary))  # shown with -s, or on failure
    # raw_decode: mpirun's output forwarding may append another rank's text to the line.
    assert json.JSONDecoder().raw_decode(printed[0][printed[0].index("{"):])[0] == summary
    return summary


def assert_one_model(model_dir: Path, summary: dict[str, Any]) -> None:
    models = sorted(model_dir.rglob("model.keras"))
    assert models == [model_dir / "model.keras"], models
    assert summary["model_path"] == str(model_dir / "model.keras")
    leftovers = [p for p in model_dir.rglob("*") if ".tfdist-tmp-" in str(p)]
    assert not leftovers, f"temporary copies left behind: {leftovers}"
    backups = [p for p in (model_dir / "backup").rglob("*") if p.is_file()]
    assert not backups, f"a finished fit leaves no backup: {backups}"


def tensorboard_scalars(events: Path) -> dict[str, list[float]]:
    """The scalars of one TFRecord event file, by tag, in step order (no TensorFlow needed)."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.util import tensor_util

    scalars: dict[str, list[float]] = {}
    data, at = events.read_bytes(), 0
    while at < len(data):  # record: length (8), its crc (4), the Event, its crc (4)
        (length,) = struct.unpack("<Q", data[at:at + 8])
        event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
        at += 16 + length
        for value in event.summary.value:
            if value.HasField("simple_value"):
                scalars.setdefault(value.tag, []).append(value.simple_value)
            elif value.metadata.plugin_data.plugin_name == "scalars":
                number = tensor_util.make_ndarray(value.tensor).item()
                scalars.setdefault(value.tag, []).append(float(number))
    return scalars


def assert_chief_tensorboard(model_dir: Path, summary: dict[str, Any], runs: int = 1) -> None:
    """One event file per run, the chief's; the last run's epoch_loss curve is the summary's
    (to float32 precision)."""
    files = sorted(p for p in (model_dir / "tensorboard").rglob("*") if p.is_file())
    assert [p.parent.name for p in files] == ["train"] * runs, f"one writer, the chief: {files}"
    losses = tensorboard_scalars(files[-1])["epoch_loss"]
    assert len(losses) == summary["epochs_run"], losses
    assert losses[-1] == pytest.approx(summary["final_loss"], rel=1e-6), losses


def check_summary(summary: dict[str, Any], topology: str, model_dir: Path, script: str,
                  first_epoch: int = 1, runs: int = 1) -> None:
    """What every finished run shows: strategy, replicas, the epochs run from ``first_epoch``
    on, one model, and (``model.fit`` examples) the chief's TensorBoard curve."""
    expected_strategy = topology.removesuffix(TF_KERAS).split("_2ps")[0].removesuffix("_mpi")
    expected_strategy = expected_strategy.replace("pipeline_hybrid", "pipeline")
    assert summary["strategy"] == expected_strategy
    assert summary["replicas"] == TOPOLOGIES[topology][1]
    assert summary["first_epoch"] == first_epoch, summary
    assert summary["epochs_run"] == summary["epochs"] - first_epoch + 1, summary
    assert summary["samples_per_second"] > 0
    assert_one_model(model_dir, summary)
    if script != "custom_loop.py":  # the model.fit examples write the chief's TensorBoard
        assert_chief_tensorboard(model_dir, summary, runs)


def check_run(tmp_path: Path, script: str, topology: str, *args: str) -> dict[str, Any]:
    """Runs ``script`` fresh and checks it (`check_summary`); returns the chief's summary."""
    model_dir = tmp_path / "model"
    summary = chief_summary(*launch(tmp_path, script, topology, "--model-dir", str(model_dir),
                                    *args))
    check_summary(summary, topology, model_dir, script)
    return summary


# ----------------------------------------------------------------------- a restarted job
RESTART_AFTER_EPOCH = 2
"""The epoch after which every process of a restarted job exits (`CRASH_ENV`)."""


def launch_restarted(tmp_path: Path, script: str, topology: str,
                     *args: str) -> tuple[int, str, dict[str, Any]]:
    """Runs ``script`` with every process exiting after epoch `RESTART_AFTER_EPOCH`'s backup and
    the launcher restarting the whole job once; returns what `launch` does (no check: the tests
    that share the job check it)."""
    return launch(tmp_path, script, topology, "--model-dir", str(tmp_path / "model"), *args,
                  env={CRASH_ENV: str(RESTART_AFTER_EPOCH)},
                  launcher_args=("--max-restarts", "1"))


def check_restarted_run(tmp_path: Path, job: tuple[int, str, dict[str, Any]], script: str,
                        topology: str) -> dict[str, Any]:
    """`check_summary` for a `launch_restarted` job: the restarted run (the last of two) ran
    only the epochs after `RESTART_AFTER_EPOCH`; returns the chief's summary."""
    summary = chief_summary(*job)
    check_summary(summary, topology, tmp_path / "model", script,
                  first_epoch=RESTART_AFTER_EPOCH + 1, runs=2)
    return summary


# ------------------------------------ the image classifier restarted: test_example_restarts_*.py
RestartedJob = tuple[Path, str, tuple[int, str, dict[str, Any]]]
"""(its tmp_path, topology, what `launch_restarted` returned)."""


def restarted_image_classifier(request: pytest.FixtureRequest,
                               tmp_path_factory: pytest.TempPathFactory) -> RestartedJob:
    """The body of a module-scoped fixture, parametrized indirectly by topology: the image
    classifier's default 8 epochs, crashed after epoch 2 and restarted (`launch_restarted`)."""
    tmp_path = tmp_path_factory.mktemp(request.param)
    return tmp_path, request.param, launch_restarted(tmp_path, "image_classifier.py",
                                                     request.param)


def assert_reaches_95_percent(job: RestartedJob) -> None:
    """The accuracy the example promises after its default 8 epochs (chance: 10%), a restart
    between them, under ``topology`` and the Keras it names."""
    tmp_path, topology, launched = job
    summary = check_restarted_run(tmp_path, launched, "image_classifier.py", topology)
    assert summary["test_accuracy"] >= 0.95, summary
    assert summary["keras"] == ("tf_keras" if topology.endswith(TF_KERAS) else "keras3")


def assert_resumed_from_backup(job: RestartedJob) -> None:
    """Every process exited after epoch 2's backup; the launcher restarted the job once, and fit
    continued at epoch 3 (tf-keras's multi-worker backup; Keras 3's, written by the chief only
    and read by every worker; under ParameterServer tfdist.fit's; Horovod: one per rank)."""
    tmp_path, _, (status, output, results) = job
    assert f"{CRASH_ENV}={RESTART_AFTER_EPOCH}: crashing on purpose" in output
    assert "restarting the whole job (1/1)" in output
    summary = chief_summary(status, output, results)
    assert (summary["first_epoch"], summary["epochs_run"]) == (3, summary["epochs"] - 2)
    assert summary["test_accuracy"] >= 0.8, summary
    assert_one_model(tmp_path / "model", summary)
