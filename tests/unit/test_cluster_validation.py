"""Every invalid cluster, TF_CONFIG and strategy fit is refused with a message that helps."""

from __future__ import annotations

import json
import re

import pytest

from tfdist.cluster import ClusterSpec, Task, read_tf_config
from tfdist.errors import ClusterConfigError

pytestmark = pytest.mark.unit

WORKERS = {"worker": ["h:1", "h:2"]}
TASK0 = {"type": "worker", "index": 0}


def config(cluster: object = None, task: object = None) -> dict[str, object]:
    """A TF_CONFIG dict, with two workers and worker:0 unless told otherwise."""
    return {"cluster": WORKERS if cluster is None else cluster, "task": task or TASK0}


def parts(*fragments: str) -> str:
    """A regex matching the fragments, in order, anywhere in the message."""
    return ".*".join(re.escape(fragment) for fragment in fragments)


INVALID_TF_CONFIGS = [
    pytest.param(
        '{"cluster": {', parts("not valid JSON", "line 1 column 14", "char 13"), id="json"
    ),
    pytest.param("[1, 2]", parts("not a JSON object", "Received: [1, 2]"), id="not-object"),
    pytest.param(
        {"task": TASK0}, parts('no "cluster" key', "silently trains", "alone"), id="no-cluster"
    ),
    pytest.param({"cluster": WORKERS}, parts('no "task" key', "Fix:"), id="no-task"),
    pytest.param(
        config(cluster={"Worker": ["h:1"]}),
        parts("'Worker' is not a known role", "Expected: one of chief", 'Fix: Use "worker".'),
        id="role-case",
    ),
    pytest.param(
        config(cluster={"master": ["h:1"]}, task={"type": "master", "index": 0}),
        parts("'master'", "TensorFlow 1's name", 'Fix: Use "chief".'),
        id="master",
    ),
    pytest.param(
        config(task={"type": "Worker", "index": 0}),
        parts(
            "Invalid TF_CONFIG: task.type 'Worker' is not a known role. Received: 'Worker'. "
            "Expected: one of chief, worker, ps, evaluator (lower case). Fix: Use \"worker\"."
        ),
        id="task-type-case",
    ),
    pytest.param(
        config(task={"type": "bogus", "index": 0}), parts("'bogus' is not a known role"), id="type"
    ),
    pytest.param(
        config(task={"type": "worker", "index": 0, "idx": 1}),
        parts("task has unknown keys ['idx']", 'Expected: exactly the keys "type" and "index"'),
        id="task-unknown-key",
    ),
    pytest.param(
        config(task={"type": "worker"}), parts("task lacks ['index']"), id="task-missing-index"
    ),
    pytest.param(config(task=[0]), parts('"task" is not an object'), id="task-not-object"),
    pytest.param(
        config(task={"type": "ps", "index": 0}),
        parts("task.type 'ps' has no tasks in the cluster", "cluster roles worker", 'Add "ps"'),
        id="type-absent",
    ),
    pytest.param(
        config(task={"type": "worker", "index": 2}),
        parts("task.index 2 is out of range", "Expected: an index in 0..1"),
        id="index-range",
    ),
    pytest.param(
        config(task={"type": "evaluator", "index": 1}),
        parts("task.index 1 is out of range", "Expected: 0"),
        id="evaluator-index",
    ),
    pytest.param(
        config(task={"type": "worker", "index": -1}),
        parts("task.index is not an integer >= 0", "Received: -1"),
        id="index-negative",
    ),
    pytest.param(
        config(task={"type": "worker", "index": True}),
        parts("task.index is not an integer", "Received: True", "Use the number 1, not true"),
        id="index-bool",
    ),
    pytest.param(
        config(task={"type": "worker", "index": "1"}),
        parts("task.index is not an integer", "Received: '1'", "Use the number 1"),
        id="index-string",
    ),
    pytest.param(
        config(task={"type": "worker", "index": 1.0}),
        parts("task.index is not an integer", "Use the integer 1"),
        id="index-float",
    ),
    pytest.param(
        config(cluster={"chief": ["h:1", "h:2"]}, task={"type": "chief", "index": 0}),
        parts("cluster.chief lists 2 tasks", "only one chief", 'under "worker"'),
        id="two-chiefs",
    ),
    pytest.param(
        config(cluster={"worker": ["h:1"], "evaluator": ["h:2", "h:3"]}),
        parts("cluster.evaluator lists 2 tasks", "only one evaluator"),
        id="two-evaluators",
    ),
    pytest.param(
        config(cluster={"worker": ["h:1"], "ps": ["H:1"]}),
        parts("tasks worker:0 and ps:0 have the same address", "Received: 'H:1'", "ps:0 another"),
        id="duplicate-address",
    ),
    pytest.param(
        config(cluster={"worker": ["h"]}),
        parts("cluster.worker[0] has no port", "Received: 'h'", "'h:2222'"),
        id="no-port",
    ),
    pytest.param(
        config(cluster={"worker": ["h:1", "h:abc"]}),
        parts("cluster.worker[1] has an invalid port 'abc'", "1..65535"),
        id="port-text",
    ),
    pytest.param(
        config(cluster={"worker": ["h:70000"]}),
        parts("invalid port '70000'", "Expected: a port number in 1..65535"),
        id="port-high",
    ),
    pytest.param(config(cluster={"worker": ["h:0"]}), parts("invalid port '0'"), id="port-zero"),
    pytest.param(
        config(cluster={"worker": [":2222"]}),
        parts("cluster.worker[0] has an empty host", "Received: ':2222'"),
        id="empty-host",
    ),
    pytest.param(
        config(cluster={"worker": ["::1:2222"]}),
        parts("IPv6 address without brackets", "[::1]:2222"),
        id="ipv6-brackets",
    ),
    pytest.param(
        config(cluster={"worker": []}),
        parts("cluster.worker is an empty list", 'remove the "worker" key'),
        id="empty-role",
    ),
    pytest.param(
        config(cluster={"worker": "h:1"}),
        parts("cluster.worker is not a list of 'host:port' strings", "Received: 'h:1'"),
        id="role-string",
    ),
    pytest.param(
        config(cluster={"worker": [1]}), parts("cluster.worker[0] is not a string"), id="role-ints"
    ),
    pytest.param(config(cluster=["h:1"]), parts('"cluster" is not an object'), id="cluster-list"),
    pytest.param(
        config(cluster={}), parts("the cluster has no chief, worker or ps task"), id="cluster-empty"
    ),
    pytest.param(
        config(cluster={"ps": ["h:1"]}, task={"type": "ps", "index": 0}),
        parts("Invalid TF_CONFIG: a cluster with ps tasks needs a chief or workers to train",
              "Received: {'ps': ['h:1']}", "Expected: at least one chief or worker task",
              "Fix: Add workers or a chief"),
        id="ps-only",
    ),
    pytest.param(
        config(cluster={"ps": ["h:1"], "evaluator": ["h:2"]}, task={"type": "ps", "index": 0}),
        parts("a cluster with ps tasks needs a chief or workers to train"),
        id="ps-and-evaluator-only",
    ),
    pytest.param(
        "[" * 100_000,
        parts("Invalid TF_CONFIG: it cannot be decoded as JSON (it nests too deeply).",
              "Received: 100000 characters starting '[[[[", "Expected: a small JSON object",
              "Fix: Set TF_CONFIG to the cluster and task only"),
        id="json-nested-too-deep",
    ),
    pytest.param(
        '{"cluster": ' + "1" * 5000 + "}",
        parts("Invalid TF_CONFIG: it cannot be decoded as JSON (", "digits).",
              "Received: 5013 characters starting '{\"cluster\": 111", "Fix: "),
        id="json-huge-number",
    ),
    pytest.param(
        config(cluster={"worker": ["-oProxyCommand=x:1"]}),
        parts("cluster.worker[0] has a host that starts with '-' (ssh would read it as an option)",
              "Received: '-oProxyCommand=x:1'", "Fix: Write the machine's hostname"),
        id="host-starts-with-dash",
    ),
    pytest.param(
        config(cluster={"worker": ["h:1", "h\n:2"]}),
        parts("cluster.worker[1] has a host with whitespace or a control character",
              "Received: 'h\\n:2'"),
        id="host-with-newline",
    ),
]


@pytest.mark.parametrize(("tf_config", "match"), INVALID_TF_CONFIGS)
def test_invalid_tf_config_is_refused(tf_config: object, match: str) -> None:
    text = tf_config if isinstance(tf_config, str) else json.dumps(tf_config)
    with pytest.raises(ClusterConfigError, match=match) as info:
        read_tf_config(text)
    assert str(info.value).startswith("Invalid TF_CONFIG: ")
    assert all(key in str(info.value) for key in ("Received: ", "Expected: ", "Fix: "))
    with pytest.raises(ClusterConfigError, match=match):  # Mappings get the same checks.
        ClusterSpec.from_tf_config(tf_config)  # type: ignore[arg-type]


STRATEGY_CASES = [
    pytest.param(
        {"chief": ["h:1"], "worker": ["h:2"]},
        "parameter_server",
        parts("'parameter_server' needs a ps task", "ps=1"),
        id="ps-strategy-without-ps",
    ),
    pytest.param(
        {"worker": ["h:2"], "ps": ["h:3"]},
        "parameter_server",
        parts("'parameter_server' needs a chief task", "coordinator", "chief=True"),
        id="ps-strategy-without-chief",
    ),
    *[
        pytest.param(
            {"worker": ["h:1"], "ps": ["h:2"]},
            name,
            parts(f"strategy '{name}' does not use parameter servers", "ps=0"),
            id=f"ps-with-{name}",
        )
        for name in ("multi_worker", "mirrored", "horovod", "default")
    ],
    pytest.param(  # The generic check refuses it before any strategy is looked at.
        {"ps": ["h:2"]},
        "multi_worker",
        parts("a cluster with ps tasks needs a chief or workers to train"),
        id="multi-worker-without-workers",
    ),
    pytest.param(
        {"worker": ["h:1"]},
        "Mirrored",
        parts("'Mirrored' is not a known strategy name", "multi_worker, parameter_server"),
        id="unknown-strategy",
    ),
]


@pytest.mark.parametrize(("roles", "strategy", "match"), STRATEGY_CASES)
def test_strategy_mismatch_is_refused(roles: dict, strategy: str, match: str) -> None:
    with pytest.raises(ClusterConfigError, match=match):
        ClusterSpec(**roles).validate(strategy)
    with pytest.raises(ClusterConfigError, match=match):
        read_tf_config({"cluster": roles, "task": {"type": next(iter(roles)), "index": 0}},
                       strategy=strategy)


def test_generic_validation_needs_no_ps_or_chief() -> None:
    spec = ClusterSpec(worker=["h:1"])
    assert spec.validate() is spec
    assert ClusterSpec(chief=["h:1"], ps=["h:2"]).validate("parameter_server").ps == ("h:2",)


def test_evaluator_task_without_evaluator_entry_is_valid() -> None:
    spec, task = read_tf_config(config(task={"type": "evaluator", "index": 0}))
    assert (spec.evaluator, task) == ((), Task("evaluator", 0))


def test_cluster_listing_an_evaluator_is_accepted_and_kept() -> None:
    spec, task = read_tf_config(config(cluster={"worker": ["h:1"], "evaluator": ["h:9"]}))
    assert spec.evaluator == ("h:9",) and task == Task("worker", 0)


def test_cloud_task_keys_and_extra_top_level_keys_are_ignored() -> None:
    value = {**config(task={**TASK0, "trial": ""}), "environment": "cloud"}
    assert read_tf_config(value)[1] == Task("worker", 0)


def test_tf_config_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", json.dumps(config(task={"type": "worker", "index": 1})))
    assert read_tf_config()[1] == Task("worker", 1)
    assert ClusterSpec.from_tf_config().worker == ("h:1", "h:2")
    monkeypatch.delenv("TF_CONFIG")
    with pytest.raises(ClusterConfigError, match=parts("TF_CONFIG", "not set", "Received: unset")):
        read_tf_config()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"worker": "h:1"}, parts("cluster.worker is not a list", "Received: 'h:1'")),
        ({"worker": ["h:1", "h:1"]}, parts("worker:0 and worker:1 have the same address")),
        ({"chief": ["a:1", "b:1"]}, parts("only one chief")),
        ({}, parts("Invalid cluster spec: the cluster has no chief, worker or ps task")),
        ({"evaluator": ["h:1"]}, parts("no chief, worker or ps task")),
        ({"ps": ["h:1"]}, parts("Invalid cluster spec: a cluster with ps tasks needs a chief or")),
    ],
)
def test_invalid_cluster_spec_is_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ClusterConfigError, match=match):
        ClusterSpec(**kwargs)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Task("Worker", 0), parts("Task.type 'Worker'", 'Use "worker"')),
        (lambda: Task("worker", -1), parts("Task.index must be an integer >= 0")),
        (lambda: Task.parse("worker:x"), parts("not a whole number", "worker:0")),
        (lambda: ClusterSpec(worker=["h:1"]).address("worker:1"), parts("worker:1 is not in")),
        (lambda: ClusterSpec(worker=["h:1"]).tf_config("ps", 0), parts("'ps' has no tasks")),
        (lambda: ClusterSpec(worker=["h:1"]).task_at_rank(1), parts("rank is out of range")),
    ],
)
def test_invalid_task_requests_are_refused(make: object, match: str) -> None:
    with pytest.raises(ClusterConfigError, match=match):
        make()  # type: ignore[operator]


def test_errors_are_value_errors() -> None:
    with pytest.raises(ValueError):
        read_tf_config("{")
