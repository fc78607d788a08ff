"""MultiWorkerMirrored, 2 processes, Keras 3 and tf-keras: each worker reads a known half of every
global batch, and both end with identical weights equal to the single-process reference;
``evaluate`` and ``predict`` agree with the reference too; the chief's save is the only one left on
disk; ``evaluate`` on the chief alone is refused within seconds. Keras 3 needs tfdist's shims:
without them (``TFDIST_KERAS_SHIMS=off``) its ``fit`` fails as released.
Also: a missing peer ends startup with a named error."""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from parity_checks import REFERENCE_ATOL, assert_matches_reference, max_gap

from tfdist.cluster import ClusterSpec, release_ports
from tfdist.errors import TaskFailedError
from tfdist.testing import run_cluster, run_tasks

pytestmark = pytest.mark.multiprocess

SCRIPTS = Path(__file__).parent / "scripts"
REPO = Path(__file__).resolve().parents[2]
LEGACY = {"TF_USE_LEGACY_KERAS": "1"}
FLAVOUR_ENV = {"keras3": {"TF_USE_LEGACY_KERAS": "0"}, "tf_keras": LEGACY}
PER_REPLICA, STEPS = 4, 5


@dataclass
class ParityRun:
    """One 2-worker run of ``multi_worker_parity.py``: what each worker reported, the job's
    directory (saves only) and the TensorBoard directory, kept apart from it."""

    results: dict[str, Any]
    out: Path
    tensorboard: Path


@pytest.fixture(scope="module", params=["keras3", "tf_keras"])
def parity_run(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> ParityRun:
    """The job, once per Keras flavour, read by the tests below (a launch costs two TensorFlow
    start-ups); with a TensorBoard callback when the package is installed."""
    out = tmp_path_factory.mktemp(f"multi-worker-{request.param}")
    tensorboard = tmp_path_factory.mktemp(f"tensorboard-{request.param}") / "tb"
    env = {"PYTHONPATH": str(REPO), **FLAVOUR_ENV[request.param]}
    if importlib.util.find_spec("tensorboard") is not None:
        env["TENSORBOARD_DIR"] = str(tensorboard)
    spec = ClusterSpec.local(workers=2)
    try:
        results = run_cluster(spec, SCRIPTS / "multi_worker_parity.py", [str(out)], timeout=150,
                              env=env)
    finally:
        release_ports(spec.ports())
    return ParityRun(results, out, tensorboard)


def test_workers_match_reference_and_save_once(parity_run):
    results, tmp_path = parity_run.results, parity_run.out
    chief, other = results["worker:0"], results["worker:1"]
    assert (chief["is_chief"], other["is_chief"]) == (True, False)
    assert chief["num_workers"] == other["num_workers"] == chief["num_replicas"] == 2

    # Worker w holds batches w, w+2, ... of PER_REPLICA rows: disjoint, together every row.
    expected = {w: [r for k in range(w, 2 * STEPS, 2)
                    for r in range(k * PER_REPLICA, (k + 1) * PER_REPLICA)] for w in (0, 1)}
    assert chief["rows"] == expected[0] and other["rows"] == expected[1]

    for w0, w1 in zip(chief["weights"], other["weights"], strict=True):
        np.testing.assert_array_equal(w0, w1)
    assert chief["loss"] == other["loss"]
    assert_matches_reference(chief["weights"], chief, chief["initial"])
    assert chief["initial"] == other["initial"]

    assert chief["model_path"] == str(tmp_path / "model.keras")
    assert chief["ckpt_path"] == str(tmp_path / "ckpt" / "ckpt-1")
    assert other["model_path"] is None and other["ckpt_path"] is None
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "fit.weights.h5", "model.keras"]
    assert max_gap(chief["reloaded"], chief["weights"]) <= REFERENCE_ATOL
    assert max_gap(chief["checkpointed"], chief["weights"]) <= REFERENCE_ATOL  # ModelCheckpoint

    for result in (chief, other):  # evaluate and predict: the same answers on every worker
        assert abs(result["evaluate"] - chief["reference_evaluate"]) <= REFERENCE_ATOL
        assert len(result["predict"]) == 2 * PER_REPLICA * STEPS
        assert max_gap(result["predict"], chief["reference_predict"]) <= REFERENCE_ATOL


def test_evaluate_on_the_chief_alone_is_refused_at_once(parity_run):
    chief = parity_run.results["worker:0"]
    refused = chief["chief_only_evaluate"]
    print(f"evaluate on the chief alone refused after {chief['chief_only_evaluate_s']:.2f} s")
    assert "model.evaluate under multi_worker is a collective of all 2 workers" in refused
    assert ("the process of rank 1 reached the end of the script (or failed) without calling "
            "it") in refused
    assert "Fix: call model.evaluate on every worker, not under `if strategy.is_chief`" in refused
    assert chief["chief_only_evaluate_s"] < 10, "explained only once the peer's heartbeats stopped"


def test_tensorboard_callback_writes_the_chiefs_events(parity_run):
    pytest.importorskip("tensorboard", reason="the tensorboard package is not installed "
                        "(TensorFlow 2.21 no longer depends on it)")
    events = list(parity_run.tensorboard.rglob("events.out.tfevents.*"))
    assert events and all(e.stat().st_size > 0 for e in events), events


def test_keras3_fit_fails_without_the_shims(cluster_runner, tmp_path):
    """Sabotage: the same job with the shims off fails as Keras 3 does on its own."""
    spec = ClusterSpec.local(workers=2)
    env = {**FLAVOUR_ENV["keras3"], "TFDIST_KERAS_SHIMS": "off"}
    with pytest.raises(TaskFailedError) as info:
        cluster_runner(spec, SCRIPTS / "multi_worker_parity.py", str(tmp_path), timeout=150,
                       env=env)
    assert "Attempt to convert a value (PerReplica" in info.value.output_tail


def test_missing_peer_ends_startup_with_named_error():
    spec = ClusterSpec.local(workers=2)
    env = {"TF_CONFIG": spec.tf_config_json("worker", 0), "PYTHONPATH": str(REPO), **LEGACY}
    try:
        with pytest.raises(TaskFailedError) as info:
            run_tasks({"worker:0": [sys.executable, str(SCRIPTS / "join_only.py"), "3"]},
                      env={"worker:0": env}, timeout=60)
    finally:
        release_ports(spec.ports())
    assert info.value.task == "worker:0"
    assert info.value.returncode == -9  # killed by the startup watchdog
    assert ("MultiWorkerMirroredStrategy on worker:0 did not join its cluster within 3 s; "
            "the process is killed. Received: task worker:0, no answer from: worker:1."
            ) in info.value.output_tail
