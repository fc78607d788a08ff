"""The examples in `tfdist.cluster` docstrings run and print what they say."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import tfdist.cluster

pytestmark = pytest.mark.unit

MODULES = ["tfdist.cluster"] + [
    f"tfdist.cluster.{info.name}" for info in pkgutil.iter_modules(tfdist.cluster.__path__)
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_every_public_name_has_an_example() -> None:
    missing = [
        name
        for name in tfdist.cluster.__all__
        if callable(obj := getattr(tfdist.cluster, name))
        and ">>>" not in (obj.__doc__ or "")
    ]
    assert missing == []
