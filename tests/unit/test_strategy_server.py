"""python -m tfdist.server: argument parsing, dry run, refused roles (no server started here)."""

from __future__ import annotations

import json

import pytest

from tfdist import server

pytestmark = pytest.mark.unit

CLUSTER = {"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]}


def config(task: str) -> str:
    return json.dumps({"cluster": CLUSTER, "task": {"type": task, "index": 0}})


def test_parse_args_defaults_to_environment():
    args = server.parse_args([])
    assert (args.tf_config, args.dry_run) == (None, False)


@pytest.mark.parametrize(("task", "address"), [("ps", "localhost:3"), ("worker", "localhost:2")])
def test_dry_run_names_the_task(capsys, task, address):
    assert server.main(["--tf-config", config(task), "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith(f"would serve {task}:0 at {address} of ")


@pytest.mark.parametrize("task", ["chief", "evaluator"])
def test_refuses_chief_and_evaluator(capsys, task):
    assert server.main(["--tf-config", config(task), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"tfdist.server serves worker and ps tasks, not '{task}'." in err
    assert "Fix: run the training script on" in err


def test_needs_a_ps_cluster(capsys):
    text = json.dumps({"cluster": {"worker": ["localhost:2"]}, "task": {"type": "worker",
                                                                       "index": 0}})
    assert server.main(["--tf-config", text, "--dry-run"]) == 2
    assert "strategy 'parameter_server' needs a ps task" in capsys.readouterr().err


def test_missing_tf_config(capsys, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert server.main(["--dry-run"]) == 2
    assert "TF_CONFIG environment variable is not set" in capsys.readouterr().err
