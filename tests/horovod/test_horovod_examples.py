"""Scripts written for Horovod run unchanged through ``tfdist-launch --strategy horovod``.

Each run goes through ``launch/horovod_examples.py`` (the harness of ``make horovod-examples``):
two ranks over Gloo, the Keras flavour chosen by ``TF_USE_LEGACY_KERAS`` in the launcher's
environment, and a shim that shortens training and writes each rank's weights at exit. A run
passes when both ranks end with identical weights (atol 0) that moved from their first values.

Horovod's own examples come from a checkout named by ``HOROVOD_SRC`` (CI has none: those tests
skip); ``scripts/hvd_example_style.py``, written the way they are, always runs, and its sabotaged
form (no ``DistributedOptimizer``/``DistributedGradientTape``) must fail the check.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.horovod.conftest import HOROVOD_IDLE

pytestmark = [pytest.mark.horovod, pytest.mark.multiprocess, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "scripts" / "hvd_example_style.py"


def _harness() -> ModuleType:
    path = REPO_ROOT / "launch" / "horovod_examples.py"
    spec = importlib.util.spec_from_file_location("horovod_examples", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


harness = _harness()


@pytest.fixture(scope="module", autouse=True)
def _horovod_idle() -> Iterator[None]:
    """`HOROVOD_IDLE` in the environment the harness gives its launcher (``run_env`` copies this
    process's), for this module's runs only."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in HOROVOD_IDLE.items():
            patch.setenv(name, value)
        yield


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One private HOME for the module's runs: HOME picks the warm server (tests/warm_start.py),
    so runs of one Keras share one instead of starting one each (about 5 CPU-s)."""
    return tmp_path_factory.mktemp("home")


@pytest.mark.parametrize("flavour", ["keras3", "tf-keras"])
def test_a_horovod_style_script_trains_ranks_in_sync(flavour: str, home: Path) -> None:
    result = harness.run_one(SCRIPT, harness.Example(), flavour, "gloo", home)
    assert result.status == "pass", result.detail
    assert result.identical and result.change > 1e-3


def test_the_check_fails_without_horovods_optimizer_and_tape(home: Path) -> None:
    result = harness.run_one(SCRIPT, harness.Example(args=("--sabotage",)), "keras3", "gloo",
                             home)
    assert result.status == "fail" and result.identical is False, result.detail


@pytest.mark.parametrize(("script", "flavour", "status"), [
    ("tensorflow2_keras_mnist.py", "tf-keras", "pass"),
    ("tensorflow2_mnist.py", "tf-keras", "pass"),
])
def test_horovods_own_examples_run_unchanged(script: str, flavour: str, status: str,
                                             home: Path) -> None:
    source = os.environ.get("HOROVOD_SRC")
    if not source:
        pytest.skip("set HOROVOD_SRC to a checkout of horovod/horovod at tag v0.28.1 "
                    "(its examples/tensorflow2 are not shipped with the sdist)")
    path = Path(source) / "examples" / "tensorflow2" / script
    result = harness.run_one(path, harness.RUNS[script], flavour, "gloo", home)
    assert result.status == status, result.detail
    if status == "pass":
        assert result.identical and result.change > 1e-3
