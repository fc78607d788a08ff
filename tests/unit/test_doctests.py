"""The examples in the docstrings of the strategies, the launcher and `tfdist.server` run."""

from __future__ import annotations

import doctest
import importlib

import pytest

pytestmark = pytest.mark.unit

MODULES = [
    "tfdist.core.flavour",
    "tfdist.core.traits",
    "tfdist.core.registry",
    "tfdist.core.environ",
    "tfdist.core.detect",
    "tfdist.compat",
    "tfdist.training",
    "tfdist.strategies",
    "tfdist.strategies.base",
    "tfdist.strategies.input",
    "tfdist.strategies.saving",
    "tfdist.compat.models",
    "tfdist.compat.shuffle",
    "tfdist.strategies.rendezvous",
    "tfdist.parallel",
    "tfdist.parallel.place",
    "tfdist.parallel.keys",
    "tfdist.parallel.ops",
    "tfdist.parallel.runtime",
    "tfdist.strategies.default",
    "tfdist.strategies.mirrored",
    "tfdist.strategies.multi_worker",
    "tfdist.options",
    "tfdist.strategies.parameter_server",
    "tfdist.strategies.startup",
    "tfdist.server",
    "tfdist.launcher.plan",
    "tfdist.launcher.mesh_plan",
    "tfdist.launcher.placement",
    "tfdist.launcher.options",
    "tfdist.launcher.arguments",
    "tfdist.launcher.horovodrun.elastic",
    "tfdist.launcher.horovodrun.command",
    "tfdist.launcher.export.documents",
    "tfdist.launcher.hosts.layout",
    "tfdist.launcher.slurm.task",
    "tfdist.launcher.hosts.ssh",
    "tfdist.launcher.hosts.remote",
    "tfdist.launcher.supervisor",
    "tfdist.launcher.containment",
    "tfdist.resilience.claim",
    "tfdist.resilience.pipeline_backup",
    "tfdist.strategies.pipeline_checks",
    "tfdist.parallel.consistency",
    "tfdist.pipeline.consistency",
    "tfdist.resilience.pipeline_vote",
    "tfdist.launcher.summary",
    "tfdist.advise.script_check",
    "tfdist.bench.advise_budget",
    "tfdist.startup_hook",
    "tfdist.launcher.local.tasks",
    "tfdist.launcher.ray.gang",
    "tfdist.launcher.ray.actor",
    "tfdist.launcher.ray.options",
    "tfdist.launcher.runners",
    "tfdist.launcher.hosts",
    "tfdist.launcher.ray",
    "tfdist.launcher.export",
    "tfdist.horovod.rendezvous",
    "tfdist.resilience.preemption",
    "tfdist.resilience",
    "tfdist.zero.data_axis",
    "tfdist.zero.data_axis_layers",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str, monkeypatch) -> None:
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"no examples in {name}"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
