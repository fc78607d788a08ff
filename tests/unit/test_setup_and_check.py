"""The set-up script's Horovod patch, and `tfdist-launch --check`."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from tfdist.launcher import cli

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "launch" / "setup.sh"

CMAKE_LISTS = """\
list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/mpi_ops.cc")
list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")
set(CMAKE_CXX_FLAGS "${Tensorflow_COMPILE_FLAGS} ${CMAKE_CXX_FLAGS}")
"""


def _bash(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)


def test_setup_script_parses_and_sourcing_it_runs_nothing(tmp_path):
    assert _bash(f"bash -n {SETUP}").returncode == 0
    result = _bash(f"VENV_PROBE={tmp_path} source {SETUP} && type patch_horovod_source >/dev/null")
    assert result.returncode == 0, result.stderr
    assert "[setup]" not in result.stderr


def test_horovod_patch_drops_only_the_xla_source(tmp_path):
    cmake = tmp_path / "horovod" / "tensorflow" / "CMakeLists.txt"
    cmake.parent.mkdir(parents=True)
    cmake.write_text(CMAKE_LISTS)
    result = _bash(f"source {SETUP} && patch_horovod_source {tmp_path}")
    assert result.returncode == 0, result.stderr
    patched = cmake.read_text()
    assert "xla_mpi_ops.cc" not in patched
    assert "mpi_ops.cc" in patched and "CMAKE_CXX_FLAGS" in patched


def test_check_reports_versions_keras_resolution_and_horovod(capsys):
    assert cli.main(["--check"]) == 0
    out = capsys.readouterr().out
    assert "tensorflow: 2.21" in out
    assert "tf.keras resolves to: keras3" in out or "tf.keras resolves to: tf_keras" in out
    assert "tf_keras: 2.21" in out
    report = out.split("horovod:", 1)[1]
    if importlib.util.find_spec("horovod") is None:
        assert "installed: False" in report and "launch/setup.sh" in report
        pytest.skip("Horovod not installed; checked the report says how to install it")
    assert "version: 0.28.1" in report
    assert "gloo: True" in report
