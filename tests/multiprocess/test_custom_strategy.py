"""A strategy defined outside tfdist validates, plans, exports and launches, tfdist unchanged.

`custom_strategy/mystrategies` is such a package: ``FlaggedMultiWorker`` adds one trait (an
environment variable its tasks need, checked when it is created), ``CountingMirrored`` inherits
mirrored's traits and is declared in the ``tfdist.strategies`` entry-point group by the
``mystrategies-1.0.dist-info`` beside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tfdist.cluster import ClusterSpec, release_ports
from tfdist.core import registry
from tfdist.errors import ClusterConfigError
from tfdist.launcher.export.documents import export_job
from tfdist.launcher.placement import place
from tfdist.launcher.plan import JobOptions, plan_job

HERE = Path(__file__).parent / "custom_strategy"
REPO_ROOT = Path(__file__).resolve().parents[2]
FLAGGED = "mystrategies:FlaggedMultiWorker"


@pytest.fixture
def on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    yield
    for name in (FLAGGED, "counting_mirrored"):
        registry.unregister(name)
    sys.modules.pop("mystrategies", None)


def _launch(*argv: str, timeout: float = 240, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO_ROOT)]), **extra_env}
    env.pop("TF_USE_LEGACY_KERAS", None)
    return subprocess.run([sys.executable, "-m", "tfdist.launcher.cli", *argv], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.unit
def test_module_class_name_validates_plans_and_exports(on_path):
    spec = ClusterSpec.local(workers=2, strategy=FLAGGED)
    release_ports(spec.ports())
    with pytest.raises(ClusterConfigError, match="does not use parameter servers"):
        ClusterSpec.from_hosts("h:3", workers=2, ps=1, strategy=FLAGGED)

    plan = plan_job(JobOptions("train.py", strategy=FLAGGED, workers=2))
    assert plan.roles == {"worker": 2}
    assert plan.env["MYSTRATEGIES_FLAG"] == "on" and plan.env["TFDIST_STRATEGY"] == FLAGGED
    assert "TF_USE_LEGACY_KERAS" not in plan.env  # inherited trait: fit trains with both
    placement = place(plan)
    placement.release()
    assert [dict(t.env)["MYSTRATEGIES_FLAG"] for t in placement.tasks] == ["on", "on"]

    job = yaml.safe_load(export_job(plan, "kubeflow", image="me/t:1"))
    (container,) = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert {"name": "MYSTRATEGIES_FLAG", "value": "on"} in container["env"]
    assert "export MYSTRATEGIES_FLAG=on\n" in export_job(plan, "slurm")


@pytest.mark.unit
def test_entry_point_name_resolves_to_the_class_and_its_traits(on_path):
    assert registry.strategy_traits("counting_mirrored").single_process
    cls = registry.get_strategy_class("counting_mirrored")
    assert cls.__module__ == "mystrategies" and cls.__name__ == "CountingMirrored"
    strategy = registry.get_strategy("counting_mirrored")
    assert cls.created == 1 and strategy.num_replicas_in_sync >= 1


@pytest.mark.unit
def test_a_class_without_traits_is_refused_with_the_fix(on_path):
    with pytest.raises(Exception, match="is not a tfdist strategy class") as err:
        registry.get_strategy_class("json:JSONDecoder")
    assert "Fix: subclass a tfdist strategy" in str(err.value)
    registry.unregister("json:JSONDecoder")


@pytest.mark.unit
def test_cli_dry_run_with_a_module_class_strategy(on_path, capsys):
    """``tfdist-launch``'s own entry point, in this process (a subprocess would import
    TensorFlow again, 4 CPU-s, to resolve the class)."""
    from tfdist.launcher import cli

    status = cli.main(["--dry-run", "--strategy", FLAGGED, "--workers", "2",
                       str(HERE / "train.py")])
    out = capsys.readouterr()
    assert status == 0, out.err
    lines = [json.loads(line) for line in out.out.splitlines()]
    assert [line["task"]["type"] for line in lines] == ["worker", "worker"]
    assert all(line["env"]["MYSTRATEGIES_FLAG"] == "on" for line in lines)


@pytest.mark.multiprocess
def test_launch_a_module_class_strategy_for_real(tmp_path):
    """Both workers create the user's class through ``auto`` and end with equal weights."""
    results = tmp_path / "results"
    results.mkdir()
    out = _launch("--strategy", FLAGGED, "--workers", "2", "--timeout", "200",
                  str(HERE / "train.py"), TFDIST_RESULT_DIR=str(results))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    reports = {p.stem: json.loads(p.read_text()) for p in results.glob("*.json")}
    assert sorted(reports) == ["worker_0", "worker_1"]
    assert {r["class"] for r in reports.values()} == {"FlaggedMultiWorker"}
    assert {r["replicas"] for r in reports.values()} == {2}
    w0, w1 = (reports[k]["weights"] for k in ("worker_0", "worker_1"))
    assert w0 == w1 and w0 != [[[0.0], [0.0], [0.0]], [0.0]]
