"""The set-up script (pinned installs, the Horovod patches), and `tfdist-launch --check`."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tfdist.launcher import cli

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "launch" / "setup.sh"

def _bash(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)


def test_setup_script_parses_and_sourcing_it_runs_nothing(tmp_path):
    assert _bash(f"bash -n {SETUP}").returncode == 0
    result = _bash(f"VENV_PROBE={tmp_path} source {SETUP} && type patch_horovod_source >/dev/null")
    assert result.returncode == 0, result.stderr
    assert "[setup]" not in result.stderr


def _stand_in_venv(tmp_path: Path, uv_exit: int | None = 0) -> Path:
    """A venv whose python (and uv, unless UV_EXIT is None) record their argv; uv exits UV_EXIT.
    Its pip's configuration names the index in ``$STAND_IN_PIP_INDEX``, if set (else none)."""
    calls = tmp_path / "calls"
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(
        '#!/bin/sh\nif [ "$3" = config ]; then\n'
        '  [ -n "$STAND_IN_PIP_INDEX" ] && echo "$STAND_IN_PIP_INDEX" && exit 0; exit 1\nfi\n'
        f'echo "python $@" >> {calls}\n')
    if uv_exit is not None:
        (bin_dir / "uv").write_text(f'#!/bin/sh\necho "uv $@" >> {calls}\n'
                                    f'echo "error: no index answered"\nexit {uv_exit}\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return calls


PINS = "tensorflow==2.21.0 tf-keras==2.21.0 tensorboard==2.21.0"


def test_setup_pins_tensorflow_and_reinstalls_only_when_pyproject_changes(tmp_path):
    (tmp_path / "launch").mkdir()
    shutil.copy(SETUP, tmp_path / "launch" / "setup.sh")
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("[project]\nname = 'tfdist'\n")
    calls = _stand_in_venv(tmp_path)
    install = f"source {tmp_path}/launch/setup.sh && install_python_deps"
    want = (f"uv pip install --python {tmp_path}/.venv/bin/python --compile-bytecode "
            f"-q -e {tmp_path}[test,ray,docs] {PINS}")

    assert _bash(install).returncode == 0
    assert calls.read_text().splitlines() == [want]
    assert _bash(install).returncode == 0
    assert calls.read_text().splitlines() == [want], "unchanged metadata must not reinstall"
    pyproject.write_text(pyproject.read_text() + "dependencies = ['numpy']\n")
    assert _bash(install).returncode == 0
    assert calls.read_text().splitlines() == [want, want]


@pytest.mark.parametrize("where", ["PIP_INDEX_URL", "pip.conf"])
def test_uv_is_given_the_index_pip_uses_instead_of_pypi(tmp_path, where):
    # A mirror-only machine: uv would try PyPI and fail after its timeouts, then pip installs.
    (tmp_path / "launch").mkdir()
    shutil.copy(SETUP, tmp_path / "launch" / "setup.sh")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'tfdist'\n")
    calls = _stand_in_venv(tmp_path)
    mirror = "https://mirror.internal/pypi/simple"
    env = "PIP_INDEX_URL" if where == "PIP_INDEX_URL" else "STAND_IN_PIP_INDEX"
    result = _bash(f"export {env}={mirror}; source {tmp_path}/launch/setup.sh && "
                   "install_python_deps")
    assert result.returncode == 0, result.stderr
    assert calls.read_text().splitlines() == [
        f"uv pip install --python {tmp_path}/.venv/bin/python --compile-bytecode "
        f"--index-url {mirror} -q -e {tmp_path}[test,ray,docs] {PINS}"]


@pytest.mark.parametrize("how", ["uv_fails", "pip_asked_for"])
def test_pip_installs_where_uv_fails_or_is_not_wanted(tmp_path, how):
    # uv reads no pip.conf: an index only pip knows of (or no PyPI) makes it fail, and pip does it.
    (tmp_path / "launch").mkdir()
    shutil.copy(SETUP, tmp_path / "launch" / "setup.sh")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'tfdist'\n")
    calls = _stand_in_venv(tmp_path, uv_exit=2)
    env = "export TFDIST_INSTALLER=pip; " if how == "pip_asked_for" else ""
    result = _bash(f"{env}source {tmp_path}/launch/setup.sh && install_python_deps")
    assert result.returncode == 0, result.stderr
    pip = f"python -m pip install -q -e {tmp_path}[test,ray,docs] {PINS}"
    if how == "pip_asked_for":
        assert calls.read_text().splitlines() == [pip]
        return
    assert calls.read_text().splitlines()[1:] == [pip]
    assert calls.read_text().startswith("uv pip install")
    assert ("uv could not install them (error: no index answered); pip will "
            "(TFDIST_INSTALLER=pip skips uv)") in result.stderr


PATCHES = REPO / "launch" / "horovod-patches"
SDIST = Path.home() / ".cache" / "tfdist" / "sdist" / "horovod-0.28.1.tar.gz"


def test_every_horovod_patch_says_what_it_fixes():
    patches = sorted(PATCHES.glob("*.patch"))
    assert len(patches) >= 9
    for patch in patches:
        head = patch.read_text().split("\n--- a/", 1)[0]
        comment = [line for line in head.splitlines() if line.startswith("# ")]
        assert len(comment) >= 2, f"{patch.name} needs a comment saying what it fixes and why"


# Header-only libraries that no patch touches and no file the header check reads includes:
# 2,949 of the sdist's 3,726 files (a patch to one would not apply, and the check names them
# on IWYU's include path: IWYU would fail to parse, not pass, if a header included one).
UNTOUCHED = ("horovod-0.28.1/third_party/boost/", "horovod-0.28.1/third_party/eigen/")


def _extract_sdist(tmp_path: Path) -> None:
    """The cached sdist under ``tmp_path``, less `UNTOUCHED` (0.6 CPU-s; all of it, 1.4)."""
    with tarfile.open(SDIST) as sdist:
        kept = [member for member in sdist.getmembers() if not member.name.startswith(UNTOUCHED)]
        sdist.extractall(tmp_path, members=kept, filter="data")


def test_the_patches_apply_to_horovods_sdist(tmp_path):
    if not SDIST.exists():
        pytest.skip(f"{SDIST} is not cached (launch/setup.sh keeps it when it builds Horovod)")
    _extract_sdist(tmp_path)
    src = tmp_path / "horovod-0.28.1"
    result = _bash(f"source {SETUP} && patch_horovod_source {src}")
    assert result.returncode == 0, result.stderr
    assert "xla_mpi_ops.cc" not in (src / "horovod/tensorflow/CMakeLists.txt").read_text()
    assert "gloo_iface_ = global_context.gloo_iface_;" in (
        src / "horovod/common/gloo/gloo_context.cc").read_text()
    assert "def _keras3_apply(" in (src / "horovod/_keras/__init__.py").read_text()
    assert "def on_train_begin(" in (src / "horovod/_keras/callbacks.py").read_text()
    gloo_cmake = (src / "third_party/gloo/CMakeLists.txt").read_text()
    assert "cmake_minimum_required(VERSION 3.5...3.10" in gloo_cmake
    # What GCC 13's libstdc++ no longer brings in transitively (patch 03)
    common = src / "horovod/common"
    assert {"#include <string>", "#include <cstdint>"} <= set(
        (common / "group_table.h").read_text().splitlines())
    assert {"#include <stdexcept>", "#include <cstdint>"} <= set(
        (common / "common.h").read_text().splitlines())


def test_a_horovod_source_the_patch_does_not_fit_stops_the_build(tmp_path):
    patches = tmp_path / "patches"
    patches.mkdir()
    shutil.copy(PATCHES / "02-gloo-process-set-interface.patch", patches)
    gloo = tmp_path / "src" / "horovod" / "common" / "gloo" / "gloo_context.cc"
    gloo.parent.mkdir(parents=True)
    gloo.write_text("// moved elsewhere in a new release\n")
    src = tmp_path / "src"
    result = _bash(f"source {SETUP} && HOROVOD_PATCHES={patches} patch_horovod_source {src}")
    assert result.returncode != 0
    assert "applying 02-gloo-process-set-interface.patch to Horovod 0.28.1 failed" in result.stderr


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


@pytest.mark.slow  # seconds of training, a TF process or waiting: make test, not test-fast
def test_a_long_step_reports_its_progress_and_keeps_its_exit_status(tmp_path):
    # A stand-in for the Horovod build: CMake-style progress lines, 3 s, then exit 7.
    build = "for p in 10 55; do echo \"[ $p%] Building CXX object x.o\"; sleep 1.2; done; exit 7"
    result = _bash(f"source {SETUP} && TFDIST_PROGRESS_SECONDS=1 run_with_progress "
                   f"'building X' {tmp_path}/build.log bash -c '{build}' || echo status $?")
    progress = [line for line in result.stderr.splitlines() if "building X" in line]
    assert len(progress) >= 2, result.stderr
    assert progress[0].startswith("[setup] building X: 0m1s") and "at [ 10%]" in progress[0]
    assert "at [ 55%]" in progress[-1]
    assert result.stdout.strip() == "status 7"
    assert "Building CXX object" in (tmp_path / "build.log").read_text()


def _fake_apt(tmp_path: Path, install: str) -> tuple[Path, Path]:
    """A bin folder whose apt-get records its argv (install runs INSTALL first) and id says root."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    (bin_dir / "id").write_text("#!/bin/sh\necho 0\n")
    (bin_dir / "apt-get").write_text(
        f'#!/bin/sh\n[ "$1" = install ] && {{ {install}; }}\necho "apt-get $*" >> {calls}\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return bin_dir, calls


# What start_system_packages looks for: two commands missing (one package named twice), one there.
PAIRS = ("system_package_pairs() { echo no-such-a:pkg-a true:pkg-true no-such-b:pkg-b "
         "no-such-c:pkg-a; }")


def test_system_packages_install_in_one_apt_call_beside_pip_and_are_waited_for(tmp_path):
    bin_dir, calls = _fake_apt(tmp_path, "sleep 1")
    result = _bash(f"PATH={bin_dir}:/usr/bin:/bin; source {SETUP} && {PAIRS}; "
                   f"start_system_packages 1 && echo pip >> {calls} && "
                   f"wait_for_system_packages && echo horovod >> {calls}")
    assert result.returncode == 0, result.stderr
    lines = calls.read_text().splitlines()
    install = "apt-get install -y -qq --no-install-recommends pkg-a pkg-b pkg-a"
    assert sorted(lines) == sorted(["apt-get update -qq", "pip", install, "horovod"])
    assert lines.index("pip") < lines.index(install) < lines.index("horovod"), lines
    assert "installing system packages in the background: pkg-a pkg-b" in result.stderr


def test_a_failed_system_package_install_is_reported_and_set_up_goes_on(tmp_path):
    bin_dir, calls = _fake_apt(tmp_path, "echo 'E: Unable to locate package pkg-b'; exit 100")
    result = _bash(f"PATH={bin_dir}:/usr/bin:/bin; source {SETUP} && {PAIRS}; "
                   f"start_system_packages 1 && wait_for_system_packages && echo next")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "next\n"
    assert "installing the system packages together failed; each group is tried alone" in (
        result.stderr)
    assert "E: Unable to locate package pkg-b" in result.stderr


def test_set_up_stopped_early_still_waits_for_apt(tmp_path):
    # Killing apt-get mid-install would leave dpkg half-configured: a failing pip step must not.
    bin_dir, calls = _fake_apt(tmp_path, "sleep 1")
    result = _bash(f"PATH={bin_dir}:/usr/bin:/bin; source {SETUP} && {PAIRS}; "
                   f"start_system_packages 1 && die 'pip failed'")
    assert result.returncode == 1
    assert "error: pip failed" in result.stderr
    assert "apt-get install -y -qq --no-install-recommends pkg-a pkg-b pkg-a" in (
        calls.read_text().splitlines())


def test_setup_refuses_an_unknown_option_before_doing_anything(tmp_path):
    (tmp_path / "launch").mkdir()
    shutil.copy(SETUP, tmp_path / "launch" / "setup.sh")
    result = _bash(f"bash {tmp_path}/launch/setup.sh --with-slrum")
    assert result.returncode == 1
    assert ("unknown option --with-slrum (known: --minimal, --with-slurm, --horovod-wheel DIR)"
            in result.stderr)
    assert not (tmp_path / ".venv").exists()


def _fake_build(tmp_path: Path, pip_output: str) -> subprocess.CompletedProcess[str]:
    """Runs build_horovod_wheel on a one-file sdist; a stand-in pip prints OUTPUT and fails."""
    src = tmp_path / "horovod-0.28.1"
    src.mkdir()
    (src / "setup.py").write_text("v = 1\n")
    (tmp_path / "cache" / "sdist").mkdir(parents=True)
    with tarfile.open(tmp_path / "cache" / "sdist" / "horovod-0.28.1.tar.gz", "w:gz") as sdist:
        sdist.add(src, arcname="horovod-0.28.1")
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "01.patch").write_text(
        "--- a/setup.py\n+++ b/setup.py\n@@ -1 +1 @@\n-v = 1\n+v = 2\n")
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\ncat <<'OUT'\n{pip_output}\nOUT\nexit 1\n")
    python.chmod(0o755)
    (tmp_path / "tmp").mkdir()
    return _bash(f"export TMPDIR={tmp_path}/tmp TFDIST_CACHE_DIR={tmp_path}/cache; "
                 f"source {SETUP} && VENV={tmp_path}/venv HOROVOD_PATCHES={patches} "
                 f"build_horovod_wheel {tmp_path}/wheels")


def test_a_failed_horovod_build_shows_its_first_error_and_names_the_log(tmp_path):
    output = ("-- Looking for strerror_r\n"
              "  CMake Error at third_party/gloo/CMakeLists.txt:1 (cmake_minimum_required):\n"
              "    Compatibility with CMake < 3.5 has been removed from CMake.\n"
              "  error: subprocess-exited-with-error")
    result = _fake_build(tmp_path, output)
    log = tmp_path / "cache" / "logs" / "horovod-build.log"
    assert result.returncode == 1
    assert "CMake Error at third_party/gloo/CMakeLists.txt:1" in result.stderr
    assert "Compatibility with CMake < 3.5 has been removed" in result.stderr  # the why, too
    assert "strerror_r" not in result.stderr
    assert "Horovod build failed (cmake version" in result.stderr
    assert f"Full log: {log} (first errors above)" in result.stderr
    assert "subprocess-exited-with-error" in log.read_text()
    assert not list((tmp_path / "tmp").iterdir()), "the unpacked sdist must not stay behind"


def test_a_failed_compile_shows_the_compilers_error(tmp_path):
    output = ("  [ 40%] Building CXX object common.cc.o\n"
              "  horovod/common/group_table.h:31:8: error: 'string' in namespace 'std' does not "
              "name a type\n"
              "     31 |   std::string name;\n"
              "  error: subprocess-exited-with-error")
    result = _fake_build(tmp_path, output)
    assert result.returncode == 1
    assert "group_table.h:31:8: error: 'string' in namespace 'std'" in result.stderr
    assert "std::string name;" in result.stderr


def test_stopping_set_up_stops_the_whole_build(tmp_path):
    # The stand-in build is a process tree (like pip -> cmake -> make -> c++); TERM to set-up
    # must end all of it. Without its own process group the grandchild would keep running.
    pid_file = tmp_path / "grandchild"
    build = f"sleep 120 & echo $! > {pid_file}; wait"
    setup = subprocess.Popen(
        ["bash", "-c", f"source {SETUP} && run_with_progress 'building X' {tmp_path}/log "
                       f"bash -c '{build}'"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline, "the stand-in build did not start"
        time.sleep(0.1)
    grandchild = int(pid_file.read_text())
    setup.send_signal(signal.SIGTERM)
    try:
        assert setup.wait(timeout=10) == 143
        time.sleep(0.5)
        assert not _running(grandchild), "the build outlived set-up"
    finally:
        if _running(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def _running(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _patched_sdist(tmp_path: Path, patches: list[Path]) -> Path:
    if not SDIST.exists():
        pytest.skip(f"{SDIST} is not cached (launch/setup.sh keeps it when it builds Horovod)")
    _extract_sdist(tmp_path)
    chosen = tmp_path / "patches"
    chosen.mkdir()
    for patch in patches:
        shutil.copy(patch, chosen)
    src = tmp_path / "horovod-0.28.1"
    result = _bash(f"source {SETUP} && HOROVOD_PATCHES={chosen} patch_horovod_source {src}")
    assert result.returncode == 0, result.stderr
    return src


@pytest.mark.slow  # a GCC compile each: make test, not test-fast
@pytest.mark.parametrize("with_patch_03", [False, True])
def test_the_header_check_finds_what_gcc13_broke_and_patch_03_fixes_it(tmp_path, with_patch_03):
    if shutil.which("include-what-you-use") is None:
        pytest.skip("include-what-you-use is not installed (apt-get install iwyu; "
                    "launch/setup.sh does as root)")
    patches = sorted(PATCHES.glob("0[1-4]-*.patch"))
    if not with_patch_03:
        patches = [p for p in patches if not p.name.startswith("03-")]
    src = _patched_sdist(tmp_path, patches)
    files = ["horovod/common/group_table.h", "horovod/common/common.h"]
    result = subprocess.run([sys.executable, str(REPO / "launch" / "horovod_headers.py"),
                             str(src), *files], capture_output=True, text=True, timeout=120)
    if with_patch_03:
        assert (result.returncode, result.stdout) == (0, ""), result.stdout + result.stderr
        return
    assert result.returncode == 1, result.stderr
    # The two errors GCC 13 reported, and what it would have reported next.
    assert "horovod/common/group_table.h: <string> (for string" in result.stdout
    assert "horovod/common/common.h: <stdexcept> (for logic_error)" in result.stdout
    assert "horovod/common/group_table.h: <cstdint> (for int32_t)" in result.stdout


def test_minimal_set_up_leaves_horovod_out_and_says_how_to_add_it(tmp_path):
    # make main's set-up: TensorFlow and tfdist only. The stand-in venv python records its argv,
    # and has no horovod (`-c 'import horovod'` fails), as after a first `make main`.
    (tmp_path / "launch").mkdir()
    shutil.copy(SETUP, tmp_path / "launch" / "setup.sh")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'tfdist'\n")
    calls = tmp_path / "python-calls"
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n[ "$1" = -c ] && exit 1\nexit 0\n')
    (python.parent / "uv").write_text(f'#!/bin/sh\necho "uv $@" >> {calls}\n')
    for tool in python.parent.iterdir():
        tool.chmod(0o755)
    env = f"TFDIST_CACHE_DIR={tmp_path}/cache PATH=/usr/bin:/bin"
    result = _bash(f"{env} bash {tmp_path}/launch/setup.sh --minimal")
    assert result.returncode == 0, result.stderr
    recorded = calls.read_text()
    assert "uv pip install" in recorded and "-q -e" in recorded and "tensorflow==2.21.0" in recorded
    assert "pip wheel" not in recorded and ".whl" not in recorded  # no Horovod build or install
    assert "--minimal: Horovod not installed; make horovod (bash launch/setup.sh) adds it" in (
        result.stderr)
    assert not (tmp_path / "cache").exists()
