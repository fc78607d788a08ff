"""detect(): which strategy "auto" picks for each environment, and why; the default strategy it
falls back to: its task and chiefhood in a larger job, its strict TF_CONFIG."""

from __future__ import annotations

import json

import pytest

from tfdist.core.detect import RANK_VARIABLES, detect
from tfdist.errors import ClusterConfigError, StrategyConfigError

pytestmark = pytest.mark.unit


def tf_config(task: str = "worker", index: int = 0, **roles: list[str]) -> dict[str, str]:
    return {"TF_CONFIG": json.dumps({"cluster": roles, "task": {"type": task, "index": index}})}


@pytest.mark.parametrize(
    ("env", "gpus", "name", "reason_part"),
    [
        (tf_config("chief", chief=["a:1"], worker=["b:1"], ps=["c:1"]), 0, "parameter_server",
         "1 ps task"),
        (tf_config(chief=["a:1"], worker=["b:1", "b:2"], ps=["c:1", "c:2"]), 8, "parameter_server",
         "2 ps task"),
        (tf_config(worker=["a:1", "b:1"]), 0, "multi_worker", "2 workers"),
        (tf_config("chief", chief=["a:1"], worker=["b:1"]), 4, "multi_worker", "2 workers"),
        (tf_config(worker=["a:1"]), 0, "default", "1 worker in TF_CONFIG"),
        (tf_config(worker=["a:1"]), 2, "mirrored", "2 local GPUs"),
        (tf_config("evaluator", worker=["a:1", "b:1"], ps=["c:1"]), 0, "default", "evaluator"),
        ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}, 0, "horovod", "HOROVOD_RANK=1"),
        ({"OMPI_COMM_WORLD_RANK": "0"}, 2, "horovod", "OMPI_COMM_WORLD_RANK=0"),
        ({"PMI_RANK": "3"}, 0, "horovod", "PMI_RANK=3"),
        ({"PMIX_RANK": "0"}, 0, "horovod", "PMIX_RANK=0"),
        ({}, 2, "mirrored", "2 local GPUs and no cluster"),
        ({}, 1, "default", "1 local GPU"),
        ({}, 0, "default", "no TF_CONFIG, no Horovod rank"),
        ({"TF_CONFIG": "  "}, 0, "default", "no TF_CONFIG"),
    ],
)
def test_detect_each_environment(env, gpus, name, reason_part):
    detection = detect(env, num_gpus=gpus)
    assert detection.name == name
    assert reason_part in detection.reason


@pytest.mark.parametrize("rank_var", RANK_VARIABLES)
def test_tf_config_and_rank_contradict(rank_var):
    env = {**tf_config(worker=["a:1", "b:1"]), rank_var: "1"}
    with pytest.raises(StrategyConfigError) as info:
        detect(env, num_gpus=0)
    message = str(info.value)
    assert "both a TF_CONFIG and a Horovod/MPI rank" in message
    assert f"{rank_var}=1" in message
    assert "Fix: unset TF_CONFIG when launching with horovodrun/mpirun" in message


def test_unreadable_tf_config_is_a_cluster_error():
    with pytest.raises(ClusterConfigError, match="not a JSON object with a 'cluster' mapping"):
        detect({"TF_CONFIG": "{'cluster': }"}, num_gpus=0)


def test_strategy_named_by_the_launcher_wins_except_for_the_evaluator():
    worker = '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}'
    chosen = detect({"TFDIST_STRATEGY": "mirrored"}, num_gpus=0)
    assert chosen == ("mirrored", "TFDIST_STRATEGY=mirrored (set by tfdist-launch)")
    auto = detect({"TFDIST_STRATEGY": "auto", "TF_CONFIG": worker}, num_gpus=0)
    assert auto.name == "multi_worker"
    evaluator = '{"cluster": {"worker": ["a:1"]}, "task": {"type": "evaluator", "index": 0}}'
    assert detect({"TFDIST_STRATEGY": "multi_worker", "TF_CONFIG": evaluator}, 0).name == "default"


def test_auto_reads_tf_config_as_strictly_as_the_strategies(monkeypatch):
    """A mis-cased role once made `auto` train alone (detect counts no "worker"); now the
    default strategy it falls back to checks TF_CONFIG and raises multi_worker's own error."""
    import tfdist

    monkeypatch.setenv("TF_CONFIG", tf_config("Worker", Worker=["a:1", "b:1"])["TF_CONFIG"])
    assert detect(dict(TF_CONFIG=tf_config("Worker", Worker=["a:1"])["TF_CONFIG"]), 0).name == (
        "default")
    messages = []
    for name in ("multi_worker", "auto", "default"):
        with pytest.raises(ClusterConfigError) as raised:
            tfdist.get_strategy(name)
        messages.append(str(raised.value))
    assert messages[0] == messages[1] == messages[2]
    assert "cluster role 'Worker' is not a known role" in messages[0]
    assert messages[0].endswith('Fix: Use "worker".')


@pytest.mark.parametrize(("env", "task", "chief"), [
    (tf_config("evaluator", worker=["a:1", "b:1"]), "evaluator:0", False),
    (tf_config("evaluator", chief=["a:1"], worker=["b:1"], ps=["c:1"]), "evaluator:0", False),
    (tf_config("worker", 1, worker=["a:1", "b:1"]), "worker:1", False),
    (tf_config("worker", 0, chief=["a:1"], worker=["b:1"]), "worker:0", False),
    (tf_config("worker", 0, worker=["a:1", "b:1"]), "worker:0", True),
    (tf_config("chief", 0, chief=["a:1"], worker=["b:1"]), "chief:0", True),
    ({}, "worker:0", True),
])
def test_the_default_strategy_knows_its_task_and_is_chief_only_if_the_job_says_so(
        env, task, chief, monkeypatch, tmp_path):
    """The evaluator's `auto` strategy once reported worker:0 and is_chief=True, so a script
    writing "only on the chief" wrote the same file from the evaluator too."""
    import tfdist

    monkeypatch.delenv("TF_CONFIG", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    strategy = tfdist.get_strategy("default")
    assert (str(strategy.task), strategy.is_chief) == (task, chief)
    written = strategy.save_model(_tiny_model(strategy), tmp_path / "m.keras")
    assert (written is not None, (tmp_path / "m.keras").exists()) == (chief, chief)


def _tiny_model(strategy):
    from tfdist.core.flavour import get_keras

    keras = get_keras()
    with strategy.scope():
        return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
