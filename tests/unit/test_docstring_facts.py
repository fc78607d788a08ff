"""Facts that docstrings state, checked against the code they describe, so they cannot drift.

Each of these once said something the code no longer did: the registry's list of built-in
names, what `ClusterSpec.validate` lets each built-in have, the count of the tensor mappings,
and where `TaskKind` is declared.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tfdist.cluster.spec import ClusterSpec
from tfdist.core import registry

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2] / "tfdist"


def test_the_registry_docstring_names_exactly_the_built_ins() -> None:
    paragraph = registry.__doc__.split("Built-in names:", 1)[1].split("plus", 1)[0]
    named = re.findall(r'``"([a-z_]+)"``', paragraph)
    assert named == list(registry._BUILTINS)  # noqa: SLF001


def test_what_validate_says_of_the_built_ins_is_what_their_traits_say() -> None:
    doc = " ".join(ClusterSpec.validate.__doc__.split())
    assert ('only ``"parameter_server"`` accepts ps tasks (and needs one, and a chief); '
            '``"horovod"`` takes workers only') in doc
    traits = {name: registry.strategy_traits(name) for name in registry._BUILTINS}  # noqa: SLF001
    assert [name for name, t in traits.items() if "ps" in t.roles] == ["parameter_server"]
    assert set(traits["parameter_server"].required_roles) == {"ps", "chief"}
    assert traits["horovod"].roles == ("worker",)


def test_the_four_tensor_mappings_are_four_functions_with_a_gradient() -> None:
    source = (ROOT / "parallel" / "mappings.py").read_text()
    doc = ast.get_docstring(ast.parse(source)) or ""
    assert doc.startswith("The four tensor-parallel mappings")
    listed = re.findall(r"^\* `([a-z_]+)`", doc, flags=re.MULTILINE)
    assert listed == ["copy_to_group", "reduce_from_group", "scatter_to_group",
                      "gather_from_group"]
    defined = {node.name for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}
    assert set(listed) <= defined


def test_task_kind_is_declared_once() -> None:
    declared = []
    for path in sorted(ROOT.rglob("*.py")):
        source = path.read_text()
        if "TaskKind" not in source:  # no assignment to it: skips parsing (1 of 1.1 CPU-s)
            continue
        for node in ast.walk(ast.parse(source)):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id == "TaskKind" for t in targets):
                declared.append(str(path.relative_to(ROOT.parent)))
    assert declared == ["tfdist/core/traits.py"]
