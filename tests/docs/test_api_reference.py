"""The API reference names every public name, and its hook finds where each is defined."""

from __future__ import annotations

import importlib
import importlib.util
import re

import pytest
from docs_snippets import REPO

import tfdist

pytestmark = pytest.mark.unit

API_PAGE = REPO / "docs" / "reference" / "api.md"
_spec = importlib.util.spec_from_file_location("docs_api_hook", REPO / "docs" / "hooks" / "api.py")
hook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hook)


def _documented() -> set[str]:
    """Where each object the page documents is defined (one object may have several names)."""
    names = re.findall(r"^::: (\S+)", API_PAGE.read_text(), re.MULTILINE)
    return {hook.resolve(name) for name in names}


@pytest.mark.parametrize("package", ["tfdist", "tfdist.horovod"])
def test_every_public_name_is_in_the_api_reference(package: str) -> None:
    module = importlib.import_module(package)
    documented = _documented()
    missing = [f"{package}.{n}" for n in module.__all__
               if hook.resolve(f"{package}.{n}") not in documented]
    assert not missing, f"add to docs/reference/api.md: {missing}"


def test_the_hook_resolves_a_public_name_to_the_object_it_names() -> None:
    path = hook.resolve("tfdist.ClusterSpec")
    module, _, name = path.rpartition(".")
    assert getattr(importlib.import_module(module), name) is tfdist.ClusterSpec
    assert hook.resolve("tfdist.advise") == "tfdist.advise"


def test_the_hook_refuses_a_name_that_is_not_public() -> None:
    with pytest.raises(ValueError, match=r"'tfdist.no_such_name' is not a public name"):
        hook.resolve("tfdist.no_such_name")


def test_the_cli_reference_is_the_parsers_help() -> None:
    assert hook.help_text("tfdist-launch").startswith("usage: tfdist-launch")
