"""Round trip: every TF_CONFIG tfdist writes is read back as intended by TensorFlow itself.

The only unit-test module (with the TF server check in ``test_cluster_ports.py``) that imports
TensorFlow.
"""

from __future__ import annotations

import pytest

from tfdist.cluster import ClusterSpec, Task, read_tf_config

pytestmark = pytest.mark.unit

tf = pytest.importorskip("tensorflow")

LAYOUTS = {
    "workers": ClusterSpec(worker=["w0:2222", "w1:2222", "w2:2222"]),
    "chief+workers": ClusterSpec(chief=["c:2222"], worker=["w0:2222", "w1:2222"]),
    "chief+workers+1ps": ClusterSpec(chief=["c:2222"], worker=["w0:2222", "w1:2222"],
                                     ps=["p0:2222"]),
    "chief+workers+2ps": ClusterSpec(chief=["c:2222"], worker=["w0:2222", "w1:2222"],
                                     ps=["p0:2222", "p1:2223"]),
    "chief+workers+ps+evaluator": ClusterSpec(chief=["c:2222"], worker=["w0:2222"],
                                              ps=["p0:2222", "[::1]:2223"], evaluator=["e:2222"]),
    "from_hosts": ClusterSpec.from_hosts("h1:3,h2:3", ps=2, chief=True, evaluator=True),
}
CASES = [
    pytest.param(spec, task, id=f"{name}-{task}")
    for name, spec in LAYOUTS.items()
    for task in spec.tasks()
]


@pytest.mark.parametrize(("spec", "task"), CASES)
def test_tensorflow_reads_back_each_tasks_tf_config(
    spec: ClusterSpec, task: Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TF_CONFIG", spec.tf_config_json(task.type, task.index))
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    training = spec.as_dict()  # Never the evaluator (tensorflow#46169).
    assert "evaluator" not in training
    assert resolver.cluster_spec().as_dict() == training
    assert (resolver.task_type, resolver.task_id) == (task.type, task.index)
    assert read_tf_config() == (ClusterSpec(**training), task)  # tfdist reads it back too.
