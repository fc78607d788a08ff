"""The sidecar evaluator: in process (`run_sidecar_evaluator`) and as a launcher's evaluator task.

The in-process tests write checkpoints of a one-variable model themselves and check the metrics the
evaluator computes from each against the values saved. The launcher test runs a ParameterServer
job with ``--evaluator``: the evaluator must train nothing, evaluate the chief's per-epoch
checkpoints up to the final epoch (the launcher gives it ``--evaluator-grace`` seconds once
training is done), and reach the accuracy the chief reports.

Timings on 2 idle cores: the in-process tests about 1 s after TensorFlow's import; the launcher
test 30-45 s (5 processes).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from tests.examples.example_jobs import assert_one_model, chief_summary, launch
from tfdist.evaluator import EvaluatorTimeoutError, is_evaluator, run_sidecar_evaluator

pytestmark = pytest.mark.multiprocess


def _save(tf, directory: Path, value: float, epoch: int) -> None:
    module = tf.Module()
    module.w = tf.Variable(value)
    checkpoint = tf.train.Checkpoint(model=module, epoch=tf.Variable(epoch, dtype=tf.int64))
    tf.train.CheckpointManager(checkpoint, str(directory), max_to_keep=5).save(
        checkpoint_number=epoch)


def _reader(tf):
    module = tf.Module()
    module.w = tf.Variable(0.0)
    return module


def test_evaluates_each_new_checkpoint_until_the_final_epoch(tmp_path):
    import tensorflow as tf

    lines: list[str] = []

    def chief() -> None:  # writes epochs 1..3, one every 0.3 s, as a training chief would
        for epoch in (1, 2, 3):
            _save(tf, tmp_path / "ckpt", 10.0 * epoch, epoch)
            time.sleep(0.3)

    writer = threading.Thread(target=chief)
    writer.start()
    results = run_sidecar_evaluator(
        _reader(tf), tmp_path / "ckpt", lambda m: {"w": float(m.w.numpy())}, final_epoch=3,
        timeout_seconds=10, poll_seconds=0.05, results_path=tmp_path / "eval" / "r.jsonl",
        log=lines.append)
    writer.join()
    assert [r.epoch for r in results][-1] == 3
    assert all(r.metrics == {"w": 10.0 * r.epoch} for r in results), results
    assert "[evaluator] checkpoint ckpt-3 (epoch 3): w=30.0000" in lines
    written = [json.loads(x) for x in (tmp_path / "eval" / "r.jsonl").read_text().splitlines()]
    assert [w["epoch"] for w in written] == [r.epoch for r in results]


def test_max_evaluations_and_the_x_y_form(tmp_path):
    import tensorflow as tf

    _save(tf, tmp_path, 2.0, 1)

    class Model(tf.Module):
        def __init__(self):
            self.w = tf.Variable(0.0)

        def evaluate(self, x, y, verbose, return_dict):
            return {"mse": float(tf.reduce_mean((self.w * x - y) ** 2))}

    results = run_sidecar_evaluator(Model(), tmp_path, (tf.constant([1.0]), tf.constant([5.0])),
                                    max_evaluations=1, timeout_seconds=5, log=lambda s: None)
    assert results[0].metrics == {"mse": 9.0}  # (2 * 1 - 5) ** 2


def test_no_checkpoint_times_out_with_a_clear_message(tmp_path):
    import tensorflow as tf

    started = time.monotonic()
    with pytest.raises(EvaluatorTimeoutError, match=r"No checkpoint appeared in .* within 1 s"):
        run_sidecar_evaluator(_reader(tf), tmp_path, lambda m: {}, final_epoch=3,
                              timeout_seconds=1, poll_seconds=0.1)
    assert time.monotonic() - started < 10


def test_a_missing_final_epoch_returns_what_was_evaluated(tmp_path):
    import tensorflow as tf

    _save(tf, tmp_path, 1.0, 1)
    lines: list[str] = []
    results = run_sidecar_evaluator(_reader(tf), tmp_path, lambda m: {"w": float(m.w.numpy())},
                                    final_epoch=3, timeout_seconds=1, poll_seconds=0.1,
                                    log=lines.append)
    assert [r.epoch for r in results] == [1]
    assert "stopping after 1 evaluation(s), last epoch 1 of 3" in lines[-1]


def test_bad_evaluate_argument_says_what_to_pass(tmp_path):
    with pytest.raises(TypeError, match=r"Received: list\. Fix: pass lambda model"):
        run_sidecar_evaluator(object(), tmp_path, [1, 2, 3], timeout_seconds=1)


def test_is_evaluator_reads_tf_config():
    config = {"cluster": {"worker": ["h:1"]}, "task": {"type": "evaluator", "index": 0}}
    assert is_evaluator({"TF_CONFIG": json.dumps(config)})
    config["task"]["type"] = "worker"
    assert not is_evaluator({"TF_CONFIG": json.dumps(config)})
    assert not is_evaluator({"TF_CONFIG": "not json"})


@pytest.mark.parametrize("topology", ["parameter_server", "parameter_server_tf_keras"])
def test_parameter_server_job_with_an_evaluator(tmp_path, topology):
    model_dir = tmp_path / "model"
    status, output, results = launch(
        tmp_path, "image_classifier.py", topology, "--model-dir", str(model_dir),
        "--epochs", "3", launcher_args=("--evaluator",), timeout=180)
    summary = chief_summary(status, output, results)
    assert_one_model(model_dir, summary)  # the evaluator saved no model
    evaluator = results["evaluator:0"]
    print(json.dumps(evaluator))
    flavour = "tf_keras" if topology.endswith("_tf_keras") else "keras3"
    assert evaluator["role"] == "evaluator" and evaluator["keras"] == flavour
    assert evaluator["evaluations"] >= 1 and evaluator["final_epoch"] == 3, evaluator
    # The final checkpoint holds the final weights: the same accuracy as the chief's model.
    assert evaluator["final_metric"] == pytest.approx(summary["test_accuracy"], abs=1e-6)
    assert evaluator["final_metric"] >= 0.8, evaluator  # 3 epochs; chance: 10%
    assert "[evaluator:0] [evaluator] checkpoint ckpt-3 (epoch 3): accuracy=" in output
    assert "sidecar evaluator:0 exited" not in output  # it finished on its own, status 0
    lines = (model_dir / "eval" / "results.jsonl").read_text().splitlines()
    assert len(lines) == evaluator["evaluations"]
