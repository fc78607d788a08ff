"""The set-up script (pinned installs, the Horovod patch), and `tfdist-launch --check`."""

from __future__ import annotations

import importlib.util
import shutil
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


GLOO_CONTEXT = """\
void GlooContext::InitializeForProcessSet(const GlooContext& global_context,
                                          const std::vector<int>& registered_ranks) {
  assert(global_context.IsEnabled());

  attr device_attr;
  device_attr.iface = gloo_iface_;
"""


def _bash(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)


def test_setup_script_parses_and_sourcing_it_runs_nothing(tmp_path):
    assert _bash(f"bash -n {SETUP}").returncode == 0
    result = _bash(f"VENV_PROBE={tmp_path} source {SETUP} && type patch_horovod_source >/dev/null")
    assert result.returncode == 0, result.stderr
    assert "[setup]" not in result.stderr


def test_setup_pins_tensorflow_and_reinstalls_only_when_pyproject_changes(tmp_path):
    (tmp_path / "launch").mkdir()
    shutil.copy(SETUP, tmp_path / "launch" / "setup.sh")
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("[project]\nname = 'tfdist'\n")
    calls = tmp_path / "pip-calls"
    python = tmp_path / ".venv" / "bin" / "python"  # stands in for the venv's: records its argv
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    python.chmod(0o755)
    install = f"source {tmp_path}/launch/setup.sh && install_python_deps"
    want = f"-m pip install -q -e {tmp_path}[test] tensorflow==2.21.0 tf-keras==2.21.0"

    assert _bash(install).returncode == 0
    assert calls.read_text().splitlines() == [want]
    assert _bash(install).returncode == 0
    assert calls.read_text().splitlines() == [want], "unchanged metadata must not reinstall"
    pyproject.write_text(pyproject.read_text() + "dependencies = ['numpy']\n")
    assert _bash(install).returncode == 0
    assert calls.read_text().splitlines() == [want, want]


def test_horovod_patches_drop_the_xla_source_and_pass_the_gloo_interface(tmp_path):
    cmake = tmp_path / "horovod" / "tensorflow" / "CMakeLists.txt"
    gloo = tmp_path / "horovod" / "common" / "gloo" / "gloo_context.cc"
    for path, text in ((cmake, CMAKE_LISTS), (gloo, GLOO_CONTEXT)):
        path.parent.mkdir(parents=True)
        path.write_text(text)
    result = _bash(f"source {SETUP} && patch_horovod_source {tmp_path}")
    assert result.returncode == 0, result.stderr
    patched = cmake.read_text()
    assert "xla_mpi_ops.cc" not in patched
    assert "mpi_ops.cc" in patched and "CMAKE_CXX_FLAGS" in patched
    lines = gloo.read_text().splitlines()
    at = lines.index("  assert(global_context.IsEnabled());")
    assert lines[at + 1].startswith("  gloo_iface_ = global_context.gloo_iface_;")
    assert lines.index("  device_attr.iface = gloo_iface_;") > at + 1


def test_a_horovod_source_the_patch_does_not_fit_stops_the_build(tmp_path):
    cmake = tmp_path / "horovod" / "tensorflow" / "CMakeLists.txt"
    gloo = tmp_path / "horovod" / "common" / "gloo" / "gloo_context.cc"
    for path, text in ((cmake, CMAKE_LISTS), (gloo, "// moved elsewhere in a new release\n")):
        path.parent.mkdir(parents=True)
        path.write_text(text)
    result = _bash(f"source {SETUP} && patch_horovod_source {tmp_path}")
    assert result.returncode != 0
    assert f"patching {gloo} failed" in result.stderr


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


def test_setup_refuses_an_unknown_option_before_doing_anything(tmp_path):
    (tmp_path / "launch").mkdir()
    shutil.copy(SETUP, tmp_path / "launch" / "setup.sh")
    result = _bash(f"bash {tmp_path}/launch/setup.sh --with-slrum")
    assert result.returncode == 1
    assert "unknown option --with-slrum (known: --with-slurm)" in result.stderr
    assert not (tmp_path / ".venv").exists()
