"""Pipeline strategy with real processes (one per stage, collective send/recv over gRPC): the
reassembled weights equal one process training the whole model on the same global batches, for K=2
and K=3 stages, M=1 and M=4 micro-batches, both schedules, both Kerases, and D=2 x K=2 hybrid (with
sample weights), with weight and activity regularizers on both stages (the logged loss and evaluate
include every stage's regularization, as Keras's do); zeroing the gradients sent between stages
breaks it; a stage built from a build function holds about 1/K of the model; the saved model loads
whole on one device; tfdist-launch runs it. A seeded build function gives the stages the weights
one process draws (a stage drawing from a fresh stream breaks it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from parity_checks import max_gap

from tfdist.cluster import ClusterSpec

pytestmark = pytest.mark.multiprocess

SCRIPTS = Path(__file__).parent / "scripts"
REPO = Path(__file__).resolve().parents[2]
PARITY_ATOL = 1e-5
"""float32 tolerance against the whole model in one process (measured gap: 3e-8 to 6e-8)."""
CONTROL_MIN_GAP = 1e-2
"""The sabotaged run and the one-micro-batch control must differ by more (measured: > 0.02)."""
INITIAL_ATOL = 1e-7
"""The stages' weights right after ``build_model`` of a seeded build function against the same
function's model in one process (measured: 0.0, both Kerases, every layout here)."""
FRESH_STREAM = {"TFDIST_TEST_FRESH_INITIAL_STREAM": "1"}
"""Rank 1 draws its weights from seeds of its own (`tfdist.pipeline.initial.SABOTAGE_ENV`)."""


def run_pipeline(cluster_runner, *, processes, stages, args, flavour="keras3", timeout=180,
                 env=None):
    env = {"TFDIST_STRATEGY": "pipeline", "TFDIST_PIPELINE_STAGES": str(stages), **(env or {})}
    if flavour == "tf_keras":
        env["TF_USE_LEGACY_KERAS"] = "1"
    spec = ClusterSpec.local(workers=processes)
    return cluster_runner(spec, SCRIPTS / "pipeline_parity.py", *args, env=env,
                          strategy="pipeline", timeout=timeout)


def loss_gap(result, chief):
    return float(np.max(np.abs(np.subtract(result["loss"], chief["reference_loss"]))))


@pytest.mark.parametrize("stages, micro_batches, schedule, flavour, extra", [
    (2, 1, "gpipe", "keras3", []),
    (2, 4, "1f1b", "tf_keras", ["--regularize"]),
    (3, 4, "1f1b", "keras3", ["--regularize"]),
    (3, 1, "gpipe", "tf_keras", []),
])
def test_stages_match_one_process_on_the_same_global_batches(
        cluster_runner, tmp_path, stages, micro_batches, schedule, flavour, extra):
    results = run_pipeline(cluster_runner, processes=stages, stages=stages, flavour=flavour,
                           args=["3", str(micro_batches), schedule, "--save", str(tmp_path),
                                 *extra])
    chief = results["worker:0"]
    assert chief["flavour"] == flavour and chief["strategy"] == "pipeline"
    print(f"initial gap {chief['initial_gap']:.2e}")
    assert chief["initial_gap"] <= INITIAL_ATOL  # the seeded build function's draw
    assert max_gap(chief["trained"], chief["initial"]) > 0.02, "training did not move weights"
    assert max_gap(chief["trained"], chief["reference"]) <= PARITY_ATOL
    assert max_gap(chief["trained"], chief["control"]) > CONTROL_MIN_GAP
    # Loss, evaluate and predict are the whole model's, on every stage.
    for result in results.values():
        assert loss_gap(result, chief) <= PARITY_ATOL
        np.testing.assert_allclose(result["evaluate"], chief["reference_evaluate"], rtol=1e-5)
        np.testing.assert_allclose(result["predict"], chief["reference_predict"], atol=1e-5)
    # Each process holds only its own layers; together they hold the whole model once.
    reports = [results[f"worker:{k}"]["stage"] for k in range(stages)]
    assert [r["stage"] for r in reports] == list(range(stages))
    layers = [name for r in reports for name in r["layers"]]
    assert layers == ["d0", "d1", "d2", "d3", "d4", "out"]
    assert sum(results[f"worker:{k}"]["own_weights"] for k in range(stages)) == 12
    # Saved by the chief as one model that loads whole, with the trained weights.
    assert chief["saved"] == str(tmp_path / "model.keras")
    assert all(results[f"worker:{k}"]["saved"] is None for k in range(1, stages))
    assert chief["reloaded_layers"] == layers
    assert max_gap(chief["reloaded"], chief["trained"]) == 0.0


def test_hybrid_two_replicas_of_two_stages_match_one_process(cluster_runner):
    # With sample weights: each replica must weigh its own rows (the reference weighs them too).
    # The replicas' weights are compared at every step (and pass); then replica 1 moves its
    # weights and one more step must fail on every process, naming replica 1's ranks.
    results = run_pipeline(cluster_runner, processes=4, stages=2,
                           args=["3", "2", "gpipe", "--sample-weight", "--regularize",
                                 "--then-diverge", "--no-evaluate"],
                           env={"TFDIST_CHECK_WEIGHTS_EVERY": "1"}, timeout=240)
    chief = results["worker:0"]
    assert chief["replicas"] == 2
    print(f"initial gap {chief['initial_gap']:.2e}")
    assert chief["initial_gap"] <= INITIAL_ATOL
    assert [results[f"worker:{r}"]["stage"]["replica"] for r in range(4)] == [0, 0, 1, 1]
    assert max_gap(chief["trained"], chief["initial"]) > 0.02
    assert max_gap(chief["trained"], chief["reference"]) <= PARITY_ATOL
    assert max_gap(chief["trained"], chief["control"]) > CONTROL_MIN_GAP
    for result in results.values():
        assert loss_gap(result, chief) <= PARITY_ATOL
    for rank in range(4):
        diverged = results[f"worker:{rank}"]["diverged"]
        assert "do not hold the same weights of the replicas of a stage" in diverged, diverged
        stage = rank % 2
        assert f"rank {rank + 2 - 2 * (rank // 2)} (stage {stage} of replica 1)" in diverged
        assert "Fix: change weights on every process alike" in diverged


@pytest.fixture(scope="module")
def launched_custom_loop(tmp_path_factory):
    """One job checked two ways: ``tfdist-launch`` starts it (2 stages, M=2), and its stages
    train with the custom loop (``strategy.train_step``, 1F1B, regularizers): one launch
    instead of two. Returns the launcher's exit, its log folder and each task's report."""
    tmp_path = tmp_path_factory.mktemp("launched")
    log_dir = tmp_path / "logs"
    command = [sys.executable, "-m", "tfdist.launcher.cli", "--strategy", "pipeline",
               "--workers", "2", "--stages", "2", "--micro-batches", "2",
               "--log-dir", str(log_dir), "--timeout", "240",
               str(SCRIPTS / "pipeline_parity.py"), "3", "2", "1f1b", "--custom-loop",
               "--regularize", "--no-evaluate"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TFDIST_RESULT_DIR": str(tmp_path)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    reports = {p.stem.replace("_", ":"): json.loads(p.read_text())
               for p in tmp_path.glob("*.json")}
    return done, log_dir, reports


def test_the_custom_loop_path_matches_one_process(launched_custom_loop):
    done, _, results = launched_custom_loop
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(results) == ["worker:0", "worker:1"]
    chief = results["worker:0"]
    assert max_gap(chief["trained"], chief["initial"]) > 0.02
    assert max_gap(chief["trained"], chief["reference"]) <= PARITY_ATOL
    for result in results.values():  # fit's epoch loss is the mean of the step losses too
        assert loss_gap(result, chief) <= PARITY_ATOL


def test_zeroed_gradient_transfers_break_parity(cluster_runner):
    # The same checks as above must fail when the mechanisms are broken: the gradients sent
    # back are zeroed, and stage 1 draws its initial weights from a fresh stream.
    results = run_pipeline(cluster_runner, processes=2, stages=2,
                           args=["3", "2", "gpipe", "--sabotage", "--no-evaluate"],
                           env=FRESH_STREAM)
    chief = results["worker:0"]
    assert max_gap(chief["trained"], chief["reference"]) > CONTROL_MIN_GAP
    print(f"initial gap {chief['initial_gap']:.2e}")
    assert chief["initial_gap"] > CONTROL_MIN_GAP


def test_a_stage_built_from_a_function_holds_about_one_kth_of_the_model(cluster_runner):
    spec = ClusterSpec.local(workers=2)
    env = {"TFDIST_STRATEGY": "pipeline", "TFDIST_PIPELINE_STAGES": "2"}
    results = cluster_runner(spec, SCRIPTS / "pipeline_memory.py", env=env, strategy="pipeline",
                             timeout=180)
    for result in results.values():
        stage = result["stage"]
        whole, share = stage["model_param_bytes"], stage["model_param_bytes"] / 2
        assert result["held_bytes"] == stage["param_bytes"]
        assert abs(stage["param_bytes"] - share) <= stage["largest_layer_bytes"]
        # Every variable the stage's build created: its own weights (67 of 134 MB), never the
        # other stage's; building the whole model creates all of them (the control).
        assert abs(result["stage_created_bytes"] - share) <= stage["largest_layer_bytes"]
        assert result["stage_created_bytes"] < 0.6 * whole  # measured 67.3 of 134.4 MB
        assert result["whole_created_bytes"] >= whole
        # Resident memory is reported, not asserted: a first large build leaves 100+ MB of freed
        # initialiser temporaries resident on some machines (measured 68 MB growth on one, 210
        # MB on another, where the whole model's build afterwards grew it by 142 MB).
        assert result["whole_build_growth"] > 0
        assert result["loss"][-1] < result["loss"][0] * 1.05


def test_tfdist_launch_runs_a_pipeline_job(launched_custom_loop):
    done, log_dir, reports = launched_custom_loop
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(os.listdir(log_dir)) == ["worker_0.log", "worker_1.log"]
    chief = reports["worker:0"]
    assert max_gap(chief["trained"], chief["reference"]) <= PARITY_ATOL
