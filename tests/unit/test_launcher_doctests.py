"""The examples in the launcher's docstrings (plan, exports, hosts, Slurm shim) run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest

pytestmark = pytest.mark.unit

MODULES = [
    "tfdist.launcher.plan",
    "tfdist.launcher.export",
    "tfdist.launcher.hosts",
    "tfdist.launcher.slurm_task",
    "tfdist.launcher.ssh",
    "tfdist.launcher.remote",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str, monkeypatch) -> None:
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"no examples in {name}"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
