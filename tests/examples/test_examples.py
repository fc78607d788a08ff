"""The Keras examples, run through ``tfdist-launch`` under every strategy each one supports.

Every run asserts its JSON summary (replicas as the strategy implies; the metric better than
chance by a stated margin), that the chief alone printed it, and that exactly one model was saved
(``<model-dir>/model.keras``; no temporary copies, no backups left): `example_jobs.check_run`.
The resume test here crashes a job deterministically after epoch ``k`` with
``TFDIST_EXAMPLE_CRASH_AFTER_EPOCH`` (see ``keras_examples/common.py``) and checks that the
restarted job runs only the remaining epochs. The image classifier under multi_worker,
ParameterServer and Horovod runs in ``test_example_restarts_*.py``: one job, crashed and
restarted, checked for both the 95% and the resume.

Timings on 2 idle cores: 10-25 s per run (4 processes for ParameterServer).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.examples.example_jobs import (
    CRASH_ENV,
    CRASH_EXIT_STATUS,
    EXAMPLES,
    TF_KERAS,
    assert_one_model,
    check_run,
    chief_summary,
    launch,
)

pytestmark = pytest.mark.multiprocess

# ----------------------------------------------------------------------- image_classifier
FAST_IMAGE = ("default",)  # and, in test_example_restarts_*.py, parameter_server, multi_worker


@pytest.mark.parametrize("topology", [
    pytest.param(t, marks=[] if t in FAST_IMAGE else [pytest.mark.slow])
    for t in ("default", "mirrored", "mirrored_tf_keras", "parameter_server_tf_keras",
              "horovod_tf_keras")
])
def test_image_classifier_reaches_95_percent(tmp_path, topology):
    # Default epochs (8): the accuracy the example promises, under every strategy and both
    # Kerases (multi_worker, multi_worker_tf_keras, parameter_server and horovod: in
    # test_example_restarts_*.py, the job restarted after epoch 2). Chance: 10%.
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
# 10,000 rows: held-out AUC 0.69-0.70 after 2 epochs under every strategy (0.67 with 20,000:
# the second epoch over-fits the 75,000 embedding rows), at half the steps.
CTR_ARGS = ("--train-samples", "10000", "--test-samples", "5000", "--epochs", "2")


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


@pytest.mark.unit
@pytest.mark.cold_start  # warm, it would start a server (TensorFlow) for a process that needs none
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
