"""Writability checks made before the work that writes (tfdist.paths)."""

from __future__ import annotations

import doctest
import os

import pytest

from tfdist import paths

pytestmark = pytest.mark.unit


def test_directories_and_files_under_a_file_or_unwritable(tmp_path):
    (tmp_path / "f").write_text("x")
    assert paths.directory_problem(tmp_path / "a" / "b") is None
    taken = str(tmp_path / "f")
    assert paths.directory_problem(tmp_path / "f") == f"{taken!r} is a file, not a directory"
    assert "is a file" in paths.directory_problem(tmp_path / "f" / "d" / "e")
    assert paths.file_problem(tmp_path / "d" / "m.keras") is None
    assert "is a file" in paths.file_problem(tmp_path / "f" / "m.keras")
    assert paths.file_problem(tmp_path) == f"{str(tmp_path)!r} is a directory"
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert "is not writable" in paths.directory_problem(locked / "x")


def test_docstring_examples_run():
    result = doctest.testmod(paths)
    assert result.failed == 0 and result.attempted > 0
