"""The suite's own layout: what would stop a whole-suite collection before any test runs."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_name():
    # tests/ has no __init__.py, so pytest imports each module by its basename: two of one name
    # (e.g. a unit and a multiprocess test_launcher_mesh.py) stop collection ("import file
    # mismatch") in make test, though each runs alone.
    names = collections.Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
