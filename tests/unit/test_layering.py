"""The package's own imports follow its layers: nothing imports a module above it, no loops.

Every module under ``tfdist/`` is parsed with `ast`; module-level and function-level imports
count alike (a function-level import hides a dependency, it does not remove it), relative imports
are resolved. `LAYERS` is the order, bottom first; a module may import its own layer and the ones
below. Importing the root package ``tfdist`` itself is not checked (Python imports it before any
of its modules anyway); its ``__init__`` is the top layer. Imports of other packages (TensorFlow,
Horovod, Ray) are not this test's business.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2] / "tfdist"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("tfdist.errors", "tfdist.options", "tfdist.paths", "tfdist.core", "tfdist.logs"),  # TF-free
    ("tfdist.cluster",),  # cluster specs and TF_CONFIG: pure data
    ("tfdist.compat", "tfdist.startup_hook"),  # the Keras shims and differences, start-up hook
    ("tfdist.parallel",),  # the model-parallel substrate: mesh, place, keys, collectives
    ("tfdist.pipeline", "tfdist.tensor", "tfdist.horovod", "tfdist.training", "tfdist.watchdog",
     "tfdist.coordinator_fit", "tfdist.resilience",
     "tfdist.zero"),  # what strategies are built from
    ("tfdist.strategies", "tfdist.evaluator", "tfdist.server"),  # what a training process runs
    ("tfdist.kdist",),  # keras.distribution on TensorFlow, over the strategies
    ("tfdist.launcher", "tfdist.testing"),  # starting jobs
    ("tfdist.probe",),  # measurements the benchmark and the advisor share
    ("tfdist.advise", "tfdist.bench"),  # tools over everything
    ("tfdist",),  # the package's own __init__: the public surface
)
"""Bottom to top: each entry is a layer, each name a module or a package with all it holds."""


@dataclasses.dataclass(frozen=True)
class Import:
    """``importer`` imports ``imported`` at ``line`` (both dotted module names)."""

    importer: str
    imported: str
    line: int


def module_name(path: Path, root: Path) -> str:
    """``root/../tfdist/core/traits.py`` -> ``tfdist.core.traits`` (a package: its __init__)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(node: ast.ImportFrom, package: str, known: set[str]) -> list[str]:
    if node.level:
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        source = ".".join([*base, *([node.module] if node.module else [])])
    else:
        source = node.module or ""
    # `from a import b` imports the module a.b when there is one, else a name of a.
    return [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
            for alias in node.names]


@functools.cache
def _parsed(text: str) -> ast.Module:
    """The tree of a source text, parsed once a process: the checkout's modules are walked by
    four tests (parsing them was 0.4-0.6 of each test's 0.6-0.9 CPU-s). Nothing edits a tree."""
    return ast.parse(text)


def collect_imports(sources: Mapping[str, tuple[str, bool]]) -> list[Import]:
    """Every import of a module in ``sources`` by another, at any depth of the code.

    Args:
        sources: module name -> (its source text, whether it is a package's ``__init__``).
    """
    known = set(sources)
    found = []
    for name, (text, is_package) in sources.items():
        package = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(_parsed(text)):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                targets = _resolve(node, package, known)
            else:
                continue
            found += [Import(name, target, node.lineno) for target in targets
                      if target in known and target != name]
    return found


def read_package(root: Path) -> dict[str, tuple[str, bool]]:
    """The sources of every module under ``root`` (a package folder), by module name."""
    return {module_name(path, root): (path.read_text(), path.name == "__init__.py")
            for path in sorted(root.rglob("*.py"))}


def layer_of(module: str, layers: Sequence[Sequence[str]]) -> int | None:
    """The index of the layer whose longest matching entry holds ``module`` (None: in none)."""
    best: tuple[int, int] | None = None
    for index, entries in enumerate(layers):
        for entry in entries:
            if module == entry or module.startswith(entry + "."):
                if best is None or len(entry) > best[1]:
                    best = (index, len(entry))
    return None if best is None else best[0]


def unit_of(module: str, layers: Sequence[Sequence[str]]) -> str:
    """The layer entry (package or module) that holds ``module``: what a loop is counted between."""
    entries = [e for layer in layers for e in layer
               if module == e or module.startswith(e + ".")]
    return max(entries, key=len) if entries else module


def layering_problems(imports: Iterable[Import], layers: Sequence[Sequence[str]],
                      root_package: str = "tfdist") -> list[str]:
    """What breaks the layering: modules in no layer, upward imports, loops between units.

    Returns one line per problem (empty: the imports follow ``layers``).
    """
    problems = []
    edges: dict[str, set[str]] = {}
    for imp in imports:
        if imp.imported == root_package:
            continue
        low, high = layer_of(imp.importer, layers), layer_of(imp.imported, layers)
        for module, layer in ((imp.importer, low), (imp.imported, high)):
            if layer is None:
                problems.append(f"{module} is in no layer")
        if low is not None and high is not None and high > low:
            problems.append(f"{imp.importer}:{imp.line} imports {imp.imported}, a layer above "
                            f"it ({' '.join(layers[high])} over {' '.join(layers[low])})")
        a, b = unit_of(imp.importer, layers), unit_of(imp.imported, layers)
        if a != b:
            edges.setdefault(a, set()).add(b)
    problems += [f"import loop: {' -> '.join(cycle)}" for cycle in _cycles(edges)]
    return sorted(set(problems))


def _cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """One loop through each strongly connected group of ``edges`` larger than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return [[*_loop_in(group, edges), group[0]] for group in groups]


def _loop_in(group: list[str], edges: Mapping[str, set[str]]) -> list[str]:
    path, members = [group[0]], set(group)
    while True:
        nxt = min(n for n in edges[path[-1]] if n in members)
        if nxt == group[0] or nxt in path:
            return path[path.index(nxt):] if nxt in path else path
        path.append(nxt)


def test_no_module_imports_a_layer_above_it_and_no_loops() -> None:
    imports = collect_imports(read_package(ROOT))
    assert len(imports) > 300  # the parse found the package's imports
    assert layering_problems(imports, LAYERS) == []


def test_every_module_is_in_a_layer() -> None:
    unplaced = [m for m in read_package(ROOT) if layer_of(m, LAYERS) is None]
    assert unplaced == []


RUNNER_FAMILIES = ("local", "hosts", "horovodrun", "ray", "export", "slurm")
"""The launcher's runner families, a folder each under ``tfdist/launcher/``."""


def test_the_command_line_reaches_the_runners_through_their_registry() -> None:
    """``tfdist-launch`` picks, checks, describes and runs a runner by its record
    (`tfdist.launcher.runners`): the CLI imports no runner family, so it cannot branch on one."""
    modules = read_package(ROOT)
    families = tuple(f"tfdist.launcher.{family}" for family in RUNNER_FAMILIES)
    assert all(family in modules for family in families)  # each a package of the launcher
    assert all(layer_of(module, LAYERS) == layer_of("tfdist.launcher", LAYERS)
               for module in modules if module.startswith(families))
    direct = [f"{i.importer}:{i.line} imports {i.imported}" for i in collect_imports(modules)
              if i.importer == "tfdist.launcher.cli" and i.imported.startswith(families)]
    assert direct == []


def test_function_level_and_relative_imports_count() -> None:
    sources = {
        "pkg": ("", True),
        "pkg.low": ("def f():\n    from pkg.high import g\n", False),
        "pkg.high": ("from . import low\n", False),
        "pkg.sub": ("", True),
        "pkg.sub.a": ("from ..low import f\nfrom .b import x\n", False),
        "pkg.sub.b": ("import pkg.sub.a\n", False),
    }
    found = {(i.importer, i.imported) for i in collect_imports(sources)}
    assert found == {("pkg.low", "pkg.high"), ("pkg.high", "pkg.low"),
                     ("pkg.sub.a", "pkg.low"), ("pkg.sub.a", "pkg.sub.b"),
                     ("pkg.sub.b", "pkg.sub.a")}


def test_an_upward_import_is_reported_with_where_it_is() -> None:
    sources = {"pkg.core.traits": ("def f():\n    import pkg.cluster.spec\n", False),
               "pkg.cluster.spec": ("from pkg.core import traits\n", False),
               "pkg.core": ("", True), "pkg.cluster": ("", True)}
    layers = (("pkg.core",), ("pkg.cluster",))
    problems = layering_problems(collect_imports(sources), layers, "pkg")
    assert problems == [
        "import loop: pkg.cluster -> pkg.core -> pkg.cluster",
        "pkg.core.traits:2 imports pkg.cluster.spec, a layer above it (pkg.cluster over pkg.core)",
    ]


def test_a_loop_inside_one_layer_is_reported() -> None:
    sources = {"pkg.advise.net": ("from pkg.bench import allreduce\n", False),
               "pkg.bench.allreduce": ("", False),
               "pkg.bench.cli": ("from pkg.advise import net\n", False),
               "pkg.advise": ("", True), "pkg.bench": ("", True)}
    layers = (("pkg.advise", "pkg.bench"),)
    problems = layering_problems(collect_imports(sources), layers, "pkg")
    assert problems == ["import loop: pkg.advise -> pkg.bench -> pkg.advise"]


def test_a_module_outside_every_layer_is_reported() -> None:
    sources = {"pkg.new": ("from pkg.core import x\n", False), "pkg.core": ("x = 1\n", False)}
    problems = layering_problems(collect_imports(sources), (("pkg.core",),), "pkg")
    assert problems == ["pkg.new is in no layer"]


def test_the_declared_layers_name_real_modules() -> None:
    modules = read_package(ROOT)
    missing = [entry for layer in LAYERS for entry in layer if entry not in modules]
    assert missing == []


# ----------------------------------------------------------------- the model-parallel substrate
SUBSTRATE = "tfdist.parallel"
MESH_BUILDERS = ("tfdist.parallel", "tfdist.launcher.mesh_plan", "tfdist.kdist.mesh")
"""The modules that may build a `Mesh` from counts: the mesh package, the launcher's planner and
the one that lays a Keras ``DeviceMesh`` out on the job (`tfdist.kdist.mesh`). Everyone else
asks for its place (`tfdist.parallel.place.process_place`, `place_of`)."""


def mesh_builds(sources: Mapping[str, tuple[str, bool]]) -> list[str]:
    """Every call that builds a ``Mesh`` (``Mesh(...)``, ``Mesh.for_processes(...)``,
    ``Mesh.parse(...)``, ``Mesh.from_environment(...)``) outside `MESH_BUILDERS`, as
    ``module:line``."""
    found = []
    for name, (text, _) in sources.items():
        if any(name == m or name.startswith(m + ".") for m in MESH_BUILDERS):
            continue
        for node in ast.walk(_parsed(text)):
            if not isinstance(node, ast.Call):
                continue
            target = node.func
            if isinstance(target, ast.Attribute):
                target = target.value
            if isinstance(target, ast.Name) and target.id == "Mesh" or \
                    isinstance(target, ast.Attribute) and target.attr == "Mesh":
                found.append(f"{name}:{node.lineno}")
    return found


ENGINES = ("tfdist.pipeline", "tfdist.tensor")
"""The model-parallel engines the substrate is below."""


def engine_imports_from_below(imports: Iterable[Import],
                              layers: Sequence[Sequence[str]]) -> list[str]:
    """Every import of `ENGINES` by a module of the substrate's layer or a layer below it, as
    ``importer:line imports imported``."""
    floor = layer_of(SUBSTRATE, layers)
    assert floor is not None
    return [f"{i.importer}:{i.line} imports {i.imported}" for i in imports
            if i.imported.startswith(ENGINES) and
            (layer_of(i.importer, layers) or 0) <= floor]


def test_nothing_at_or_below_the_substrate_imports_pipeline_or_tensor() -> None:
    imports = collect_imports(read_package(ROOT))
    assert [i for i in imports if i.importer.startswith(SUBSTRATE + ".")]  # it was parsed
    below = {m for m in read_package(ROOT)
             if (layer_of(m, LAYERS) or 0) < layer_of(SUBSTRATE, LAYERS)}  # type: ignore[operator]
    assert {"tfdist.core", "tfdist.cluster", "tfdist.compat"} <= below  # the floors it covers
    assert engine_imports_from_below(imports, LAYERS) == []


def test_an_engine_imported_from_below_the_substrate_is_reported() -> None:
    sources = {"tfdist.compat.models": ("from tfdist.pipeline import stage\n", False),
               "tfdist.parallel.ops": ("def f():\n    import tfdist.tensor.plan\n", False),
               "tfdist.strategies.tensor": ("import tfdist.tensor.plan\n", False),
               "tfdist.pipeline.stage": ("", False), "tfdist.tensor.plan": ("", False)}
    assert engine_imports_from_below(collect_imports(sources), LAYERS) == [
        "tfdist.compat.models:1 imports tfdist.pipeline.stage",
        "tfdist.parallel.ops:2 imports tfdist.tensor.plan"]


def test_only_the_mesh_package_and_the_launchers_planner_build_a_mesh_from_counts() -> None:
    assert mesh_builds(read_package(ROOT)) == []


def test_a_mesh_built_anywhere_else_is_reported() -> None:
    sources = {"tfdist.pipeline.x": ("from tfdist.parallel import mesh\n"
                                     "def f(n):\n"
                                     "    a = Mesh(data=n)\n"
                                     "    b = mesh.Mesh.for_processes(n, tensor=2)\n"
                                     "    return Mesh.parse('tensor=2'), a.group('data', 0)\n",
                                     False),
               "tfdist.parallel.place": ("m = Mesh.for_processes(4, tensor=2)\n", False),
               "tfdist.launcher.mesh_plan": ("m = Mesh(tensor=2)\n", False)}
    assert mesh_builds(sources) == ["tfdist.pipeline.x:3", "tfdist.pipeline.x:4",
                                    "tfdist.pipeline.x:5"]
