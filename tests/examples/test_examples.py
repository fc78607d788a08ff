"""The Keras examples, run through ``tfdist-launch`` under every strategy each one supports.

Every run asserts its JSON summary (replicas as the strategy implies; the metric better than
chance by a stated margin), that the chief alone printed it, and that exactly one model was saved
(``<model-dir>/model.keras``; no temporary copies, no backups left). The resume tests crash a job
deterministically after epoch ``k`` with ``TFDIST_EXAMPLE_CRASH_AFTER_EPOCH`` (see
``keras_examples/common.py``) and check that the restarted job runs only the remaining epochs.

Timings on 2 idle cores: 10-25 s per run (TensorFlow's import dominates; 4 processes for
ParameterServer).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.multiprocess

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "keras_examples"
CRASH_ENV = "TFDIST_EXAMPLE_CRASH_AFTER_EPOCH"
CRASH_EXIT_STATUS = 42  # keras_examples/common.py
CHIEF_TASKS = ("chief:0", "worker:0", "rank:0")
WARM_PREIMPORT = "sklearn.datasets,sklearn.metrics"
"""What the examples import besides TensorFlow: their tasks' warm server imports it once
(tests/warm_start.py)."""

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
                 **(env or {})}
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


def assert_chief_tensorboard(model_dir: Path, summary: dict[str, Any]) -> None:
    """One event file, the chief's, whose epoch_loss curve is the run's (to float32 precision)."""
    files = sorted(p for p in (model_dir / "tensorboard").rglob("*") if p.is_file())
    assert [p.parent.name for p in files] == ["train"], f"one writer, the chief: {files}"
    losses = tensorboard_scalars(files[0])["epoch_loss"]
    assert len(losses) == summary["epochs_run"], losses
    assert losses[-1] == pytest.approx(summary["final_loss"], rel=1e-6), losses


def check_run(tmp_path: Path, script: str, topology: str, *args: str) -> dict[str, Any]:
    model_dir = tmp_path / "model"
    summary = chief_summary(*launch(tmp_path, script, topology, "--model-dir", str(model_dir),
                                    *args))
    expected_strategy = topology.removesuffix(TF_KERAS).split("_2ps")[0].removesuffix("_mpi")
    expected_strategy = expected_strategy.replace("pipeline_hybrid", "pipeline")
    assert summary["strategy"] == expected_strategy
    assert summary["replicas"] == TOPOLOGIES[topology][1]
    assert summary["epochs_run"] == summary["epochs"] and summary["first_epoch"] == 1
    assert summary["samples_per_second"] > 0
    assert_one_model(model_dir, summary)
    if script != "custom_loop.py":  # the model.fit examples write the chief's TensorBoard
        assert_chief_tensorboard(model_dir, summary)
    return summary


# ----------------------------------------------------------------------- image_classifier
FAST_IMAGE = ("default", "parameter_server", "multi_worker")


@pytest.mark.parametrize("topology", [
    pytest.param(t, marks=[] if t in FAST_IMAGE else [pytest.mark.slow])
    for t in ("default", "mirrored", "multi_worker", "parameter_server", "horovod",
              "mirrored_tf_keras", "multi_worker_tf_keras", "parameter_server_tf_keras",
              "horovod_tf_keras")
])
def test_image_classifier_reaches_95_percent(tmp_path, topology):
    # Default epochs (8): the accuracy the example promises, under every strategy and both
    # Kerases. Chance: 10%.
    summary = check_run(tmp_path, "image_classifier.py", topology)
    assert summary["test_accuracy"] >= 0.95, summary
    assert summary["keras"] == ("tf_keras" if topology.endswith(TF_KERAS) else "keras3")


@pytest.mark.slow
def test_image_classifier_trains_on_a_users_npz(tmp_path):
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images * 15).astype("uint8")  # 0..240: the example scales by 255
    np.savez(tmp_path / "digits.npz", x_train=images[:1400], y_train=digits.target[:1400],
             x_test=images[1400:], y_test=digits.target[1400:])
    summary = check_run(tmp_path, "image_classifier.py", "default",
                        "--data-dir", str(tmp_path), "--epochs", "4")
    assert summary["test_accuracy"] >= 0.6, summary  # chance: 10%


def test_image_classifier_rejects_an_incomplete_npz(tmp_path):
    sys.path.insert(0, str(EXAMPLES))
    try:
        import image_classifier
    finally:
        sys.path.remove(str(EXAMPLES))
        for name in ("image_classifier", "common"):  # generic names: keep sys.modules clean
            sys.modules.pop(name, None)
    np.savez(tmp_path / "bad.npz", x_train=np.zeros((2, 8, 8)), y_train=np.zeros(2))
    with pytest.raises(ValueError, match=r"lacks \['x_test', 'y_test'\]"):
        image_classifier.load_npz(str(tmp_path / "bad.npz"))


# ----------------------------------------------------------------------------- sparse_ctr
CTR_ARGS = ("--train-samples", "20000", "--test-samples", "5000", "--epochs", "2")


def test_sparse_ctr_shards_embeddings_over_two_ps(tmp_path):
    summary = check_run(tmp_path, "sparse_ctr.py", "parameter_server_2ps_tf_keras", *CTR_ARGS)
    assert summary["embedding_shards"] == [
        "/job:ps/replica:0/task:0/device:CPU:0", "/job:ps/replica:0/task:1/device:CPU:0"]
    assert summary["test_auc"] >= 0.6, summary  # chance: 0.5
    assert summary["test_auc"] <= summary["oracle_auc"] + 0.01


def test_sparse_ctr_keras3_places_whole_tables_on_the_ps(tmp_path):
    summary = check_run(tmp_path, "sparse_ctr.py", "parameter_server_2ps", *CTR_ARGS)
    (device,) = summary["embedding_shards"]  # Keras 3 cannot shard: the table is whole
    assert device.startswith("/job:ps/replica:0/task:"), summary
    assert summary["test_auc"] >= 0.6, summary  # chance: 0.5
    assert summary["keras"] == "keras3"


@pytest.mark.slow
@pytest.mark.parametrize("topology", ["default", "multi_worker", "multi_worker_tf_keras",
                                      "horovod"])
def test_sparse_ctr_sync_strategies(tmp_path, topology):
    summary = check_run(tmp_path, "sparse_ctr.py", topology, *CTR_ARGS)
    assert len(summary["embedding_shards"]) == 1  # whole tables: no ps to shard them over
    assert summary["test_auc"] >= 0.6, summary  # chance: 0.5


# ---------------------------------------------------------------------------- custom_loop
@pytest.mark.parametrize("topology", [
    pytest.param(t, marks=[] if t in ("multi_worker", "horovod") else [pytest.mark.slow])
    for t in ("default", "mirrored", "multi_worker", "horovod", "multi_worker_tf_keras",
              "horovod_tf_keras")
])
def test_custom_loop(tmp_path, topology):
    summary = check_run(tmp_path, "custom_loop.py", topology, "--epochs", "3")
    assert summary["test_accuracy"] >= 0.8, summary  # 3 epochs; chance: 10%
    assert summary["checkpoint"] is None  # a fresh start


@pytest.mark.horovod
def test_custom_loop_over_mpi(tmp_path):
    if shutil.which("mpirun") is None:
        pytest.skip("OpenMPI's mpirun is not installed (bash launch/setup.sh installs it as root)")
    summary = check_run(tmp_path, "custom_loop.py", "horovod_mpi", "--epochs", "3")
    assert summary["test_accuracy"] >= 0.8, summary


def test_custom_loop_refuses_parameter_server(tmp_path):
    status, output, _ = launch(tmp_path, "custom_loop.py", "parameter_server", timeout=90)
    assert status != 0
    assert "custom_loop.py does not support strategy 'parameter_server'" in output
    assert "use keras_examples/image_classifier.py or sparse_ctr.py" in output


# --------------------------------------------------------------------------- kill/resume
def test_custom_loop_resumes_its_epoch_counter_after_a_crash(tmp_path):
    model_dir = tmp_path / "model"
    args = ("--model-dir", str(model_dir), "--epochs", "3")
    status, output, results = launch(tmp_path, "custom_loop.py", "default", *args,
                                     env={CRASH_ENV: "1"})
    assert status == CRASH_EXIT_STATUS, output[-4000:]
    assert not results and not (model_dir / "model.keras").exists()
    assert (model_dir / "checkpoints" / "ckpt-1.index").exists()
    summary = chief_summary(*launch(tmp_path, "custom_loop.py", "default", *args))
    assert summary["checkpoint"] == str(model_dir / "checkpoints" / "ckpt-1")
    assert (summary["first_epoch"], summary["epochs_run"]) == (2, 2)
    assert_one_model(model_dir, summary)


@pytest.mark.slow
@pytest.mark.parametrize("topology", ["multi_worker", "multi_worker_tf_keras",
                                      "parameter_server", "horovod"])
def test_fit_resumes_from_backup_after_a_gang_restart(tmp_path, topology):
    # Every process exits after epoch 2's backup; the launcher restarts the job once, and fit
    # continues at epoch 3 (tf-keras's multi-worker backup; Keras 3's, written by the chief only
    # and read by every worker; under ParameterServer tfdist.fit's; Horovod: one per rank).
    model_dir = tmp_path / "model"
    status, output, results = launch(
        tmp_path, "image_classifier.py", topology, "--model-dir", str(model_dir),
        "--epochs", "4", env={CRASH_ENV: "2"}, launcher_args=("--max-restarts", "1"))
    assert f"{CRASH_ENV}=2: crashing on purpose" in output
    assert "restarting the whole job (1/1)" in output
    summary = chief_summary(status, output, results)
    assert (summary["first_epoch"], summary["epochs_run"]) == (3, 2)
    assert summary["test_accuracy"] >= 0.8, summary
    assert_one_model(model_dir, summary)


@pytest.mark.unit
def test_an_unwritable_model_dir_is_a_usage_error_at_start(tmp_path):
    """Before: a traceback after the first epoch. Now: exit 2 before TensorFlow is imported."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "image_classifier.py"), "--model-dir",
         str(blocker / "model")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert f"cannot write to '{blocker / 'model'}'" in out.stderr
    assert "Fix: pass a --model-dir you can create and write" in out.stderr
    assert time.monotonic() - started < 30


# ----------------------------------------------------------------------- deep_mlp
@pytest.mark.parametrize("topology", [
    pytest.param(t, marks=[] if t in ("default", "pipeline") else [pytest.mark.slow])
    for t in ("default", "pipeline", "pipeline_hybrid", "multi_worker")
])
def test_deep_mlp_runs_unchanged_under_pipeline_and_data_parallel(tmp_path, topology):
    # D=2 x K=2 with M=2 runs the BatchNormalization variant: the opt-in to per-micro-batch
    # statistics (refused without it) trains to the same bar
    norm = ["--norm", "batch"] if topology == "pipeline_hybrid" else []
    summary = check_run(tmp_path, "deep_mlp.py", topology, "--epochs", "4", *norm)
    assert summary["test_accuracy"] >= 0.9, summary  # chance: 10%
    assert summary["norm"] == ("batch" if norm else "layer")
    if topology.startswith("pipeline"):
        stage = summary["stage"]
        assert stage["stages"] == 2 and stage["stage"] == 0
        # Stage 0 holds its layers only: about half of the model, within one layer.
        half = stage["model_param_bytes"] / 2
        assert abs(stage["param_bytes"] - half) <= stage["largest_layer_bytes"]
        keras = pytest.importorskip("keras")
        whole = keras.models.load_model(tmp_path / "model" / "model.keras")
        assert whole.count_params() * 4 == stage["model_param_bytes"]


# ----------------------------------------------------------------------- transformer_lm
@pytest.mark.parametrize("topology", ["tensor", "pipeline"])
def test_transformer_lm_runs_unchanged_split_by_heads_or_between_blocks(tmp_path, topology):
    summary = check_run(tmp_path, "transformer_lm.py", topology, "--epochs", "2")
    # One process, 2 epochs of the same data: loss 2.16 -> 0.34, next-token accuracy ~0.9;
    # chance is 1/32. The chief scores the saved whole model loaded alone.
    assert summary["final_loss"] < 1.0 and summary["test_accuracy"] >= 0.6, summary
    keras = pytest.importorskip("keras")
    sys.path.insert(0, str(EXAMPLES))
    import transformer_lm  # its PositionEmbedding, registered when the class is made

    transformer_lm.position_embedding_class(keras)
    whole = keras.models.load_model(tmp_path / "model" / "model.keras")
    assert [layer.__class__.__name__ for layer in whole.layers if "attention" in layer.name
            and "norm" not in layer.name and "residual" not in layer.name] == [
        "MultiHeadAttention"] * 2  # the saved model is the plain Keras one, not the shards
