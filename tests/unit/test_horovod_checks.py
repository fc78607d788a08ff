"""Horovod bad input caught before training: no ranks, a controller Horovod was built without.

Pure checks on environments and on real ELF files; no Horovod needed except where it is skipped.
"""

from __future__ import annotations

import _ctypes
import json
import shutil
from pathlib import Path

import pytest

from tfdist.horovod import checks
from tfdist.launcher import cli

TWO_WORKERS = json.dumps({"cluster": {"worker": ["localhost:1", "localhost:2"]},
                          "task": {"type": "worker", "index": 1}})


@pytest.mark.parametrize(("environ", "received"), [
    ({"TF_CONFIG": TWO_WORKERS}, "Received: TF_CONFIG with 2 tasks (this one worker:1)"),
    ({"OMPI_COMM_WORLD_SIZE": "4"}, "Received: OMPI_COMM_WORLD_SIZE=4"),
    ({"PMI_SIZE": "3"}, "Received: PMI_SIZE=3"),
])
def test_one_horovod_process_in_a_job_of_several_is_refused(environ, received):
    message = checks.ranks_problem(1, environ)
    assert message.startswith("Horovod has no ranks: this process trains alone")
    assert received in message
    workers = checks.job_size(environ)[0]
    assert f"Fix: launch with `tfdist-launch --strategy horovod --workers {workers} script.py`" in (
        message)


@pytest.mark.parametrize(("size", "environ"), [
    (1, {}),  # a Horovod script run alone on purpose: Horovod's single-process mode
    (1, {"TF_CONFIG": json.dumps({"cluster": {"worker": ["h:1"]}, "task": {"type": "worker"}})}),
    (1, {"OMPI_COMM_WORLD_SIZE": "1"}),
    (2, {"OMPI_COMM_WORLD_SIZE": "2"}),  # real ranks
])
def test_consistent_sizes_pass(size, environ):
    assert checks.ranks_problem(size, environ) is None


def test_a_library_without_the_controllers_names_neither():
    other_elf = Path(_ctypes.__file__)  # a real shared library, built without MPI or Gloo
    assert checks.built_in_library("mpi", other_elf) is False
    assert checks.built_in_library("gloo", other_elf) is False
    assert checks.built_in_library("mpi", Path(json.__file__)) is None  # not an ELF: unknown


@pytest.mark.horovod  # Horovod's own answer imports TensorFlow in a child process: ~10 s
def test_horovods_library_names_what_it_was_built_with():
    library = checks.op_library()
    if library is None:
        pytest.skip("Horovod is not installed (bash launch/setup.sh builds it)")
    from horovod.common import util  # Horovod's own answer, for comparison

    assert checks.built_in_library("gloo", library) is True
    assert checks.built_in_library("mpi", library) is bool(util.mpi_built())


@pytest.mark.parametrize(("controller", "flag", "fix"), [
    ("mpi", "--mpi", "Fix: drop --mpi to use Gloo, or rebuild Horovod with MPI: apt-get install "
     "openmpi-bin libopenmpi-dev, then bash launch/setup.sh"),
    ("gloo", "without --mpi", "Fix: pass --mpi to use MPI, or rebuild Horovod with Gloo: bash "
     "launch/setup.sh"),
])
def test_a_controller_horovod_lacks_is_named_with_the_fix(controller, flag, fix):
    message = checks.controller_problem(controller, False)
    assert f"Received: {flag}, and Horovod's {controller}_built() is False" in message
    assert fix in message
    assert checks.controller_problem(controller, True) is None
    assert checks.controller_problem(controller, None) is None  # unknown: horovodrun decides


def test_launch_refuses_mpi_when_horovod_lacks_it_before_starting(script, capsys, monkeypatch):
    # Stands in for a Horovod built without MPI: the library and Horovod both say so.
    monkeypatch.setattr(checks, "built_in_library", lambda controller, library=None: False)
    monkeypatch.setattr(checks, "built_per_horovod", lambda controller: controller != "mpi")
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun is not installed: --mpi is refused for that first")
    assert cli.main(["--dry-run", "--strategy", "horovod", "--mpi", script]) == 2
    err = capsys.readouterr().err
    assert "--mpi runs horovodrun --mpi, but this Horovod was built without MPI" in err
    assert cli.main(["--dry-run", "--strategy", "horovod", script]) == 0  # Gloo is there


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('never run')\n")
    return str(path)


def test_launch_without_horovod_installed_names_the_command_that_builds_it(script, capsys,
                                                                           monkeypatch):
    # Stands in for a `make main` set-up (no Horovod): nothing named horovod is importable.
    real = checks.importlib.util.find_spec
    monkeypatch.setattr(checks.importlib.util, "find_spec",
                        lambda name, *a: None if name == "horovod" else real(name, *a))
    assert cli.main(["--dry-run", "--strategy", "horovod", "--workers", "2", script]) == 2
    err = capsys.readouterr().err
    assert ("--strategy horovod starts its ranks with horovodrun, but Horovod is not "
            "installed") in err
    assert "Fix: build it into this environment: `make horovod` in the tfdist checkout" in err
    monkeypatch.undo()
    if checks.op_library() is not None:  # with Horovod, the same launch is planned
        assert cli.main(["--dry-run", "--strategy", "horovod", "--workers", "2", script]) == 0


def test_check_without_horovod_names_the_command_that_builds_it(monkeypatch):
    from tfdist.launcher import check

    monkeypatch.setattr(check, "_version", lambda dist: None if dist == "horovod" else "1")
    assert check._horovod_report() == {"installed": False, "fix": checks.INSTALL_FIX}
    assert "make horovod" in checks.INSTALL_FIX
