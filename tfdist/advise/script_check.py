"""Whether a training script can be imported for its model function without running its job.

``tfdist-advise script.py:build_model`` imports the script to call ``build_model``. A script whose
main code sits at module level (``args = parser.parse_args()``, ``model.fit(...)``, ``main()``)
would run it on import: parse the advisor's own arguments, create a strategy, train. So the
script's source is read first, before anything is measured, and such a script is refused with the
fix: move that code under ``if __name__ == "__main__":`` (the advisor imports the script under
another name, so that block does not run).

What counts as main code at module level (and inside a module-level ``if``/``try``): a call of
a function the script defines (``main()``), a loop or ``with`` block, and any statement that
calls one of `MAIN_CALLS` (parsing the command line, making a strategy, training, evaluating,
saving). Imports, definitions, assignments (``KERAS = tfdist.get_keras()``) and other calls
(``keras.utils.set_random_seed(1)``, ``parser.add_argument(...)``) are import-safe.

Example:
    >>> main_code("import argparse\\nargs = argparse.ArgumentParser().parse_args()\\n")
    [(2, 'args = argparse.ArgumentParser().parse_args()')]
    >>> main_code("def build_model():\\n    return 1\\nif __name__ == '__main__':\\n    main()\\n")
    []
"""

from __future__ import annotations

import ast
from pathlib import Path

from tfdist.errors import AdviseError, format_error

__all__ = ["MAIN_CALLS", "main_code", "check_import_safe", "top_level_names", "missing_function"]

MAIN_CALLS = frozenset({
    "parse_args", "parse_known_args", "get_strategy", "fit", "evaluate", "predict",
    "train_on_batch", "save", "save_model", "save_weights", "run_sidecar_evaluator",
})
"""Calls that belong to a script's main code, not to building its model."""


def _is_main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` (either order)."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    sides = [node.test.left, *node.test.comparators]
    names = {side.id for side in sides if isinstance(side, ast.Name)}
    values = {side.value for side in sides if isinstance(side, ast.Constant)}
    return names == {"__name__"} and values == {"__main__"}


def _calls(node: ast.AST) -> set[str]:
    """The names of the functions and methods ``node`` calls (``a.b.fit()`` -> ``fit``)."""
    found = set()
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            func = call.func
            if isinstance(func, ast.Attribute):
                found.add(func.attr)
            elif isinstance(func, ast.Name):
                found.add(func.id)
    return found


def _main_statements(body: list[ast.stmt], defined: set[str]) -> list[ast.stmt]:
    """The statements of ``body`` that run main code (``defined``: the script's functions)."""
    found: list[ast.stmt] = []
    for node in body:
        if _is_main_guard(node) or isinstance(
                node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef,
                       ast.ClassDef)):
            continue
        if isinstance(node, ast.If):
            found += _main_statements(node.body, defined)
            found += _main_statements(node.orelse, defined)
        elif isinstance(node, ast.Try):
            for part in (node.body, node.orelse, node.finalbody):
                found += _main_statements(part, defined)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
            found.append(node)
        elif _calls(node) & (MAIN_CALLS | defined):
            found.append(node)
    return found


def main_code(source: str) -> list[tuple[int, str]]:
    """The module-level statements of ``source`` that would run on import (line, first line of
    text), in order; empty for an import-safe script."""
    tree = ast.parse(source)
    lines = source.splitlines()
    defined = {node.name for node in tree.body
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return [(node.lineno, lines[node.lineno - 1].strip())
            for node in _main_statements(tree.body, defined)]


def check_import_safe(path: str | Path) -> None:
    """Raises `AdviseError` when importing the script at ``path`` would run its main code.

    Example:
        >>> check_import_safe("keras_examples/deep_mlp.py")  # its main code is guarded
    """
    path = Path(path)
    try:
        found = main_code(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError) as err:
        raise AdviseError(format_error(
            f"Cannot read the script {str(path)!r}: {err}.", received=str(path),
            expected="a Python script", fix="name a readable, valid Python file")) from err
    if not found:
        return
    shown = "; ".join(f"line {line}: {text}" for line, text in found[:3])
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    raise AdviseError(format_error(
        f"{path} runs its main code when imported, and tfdist-advise imports it to call its model "
        "function: it would parse the advisor's arguments, train or save here.",
        received=f"{shown}{more}",
        expected="a script whose module level only imports and defines (functions, classes, "
        "constants)",
        fix='move that code into a function called under `if __name__ == "__main__":` at the '
        "end of the script (the advisor then skips it), or put the model function in a module "
        "of its own"))


def top_level_names(source: str) -> set[str]:
    """The names ``source`` binds at module level (definitions, assignments, imports; inside a
    module-level ``if``/``try`` too).

    Example:
        >>> sorted(top_level_names("import os\\nfrom a import b as c\\nX = 1\\n"
        ...                        "def f():\\n    y = 2\\n"))
        ['X', 'c', 'f', 'os']
    """
    names: set[str] = set()
    for node in _module_level(ast.parse(source).body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def _module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, (ast.If, ast.Try)):
            nested = [*node.body, *node.orelse, *getattr(node, "finalbody", []),
                      *(s for h in getattr(node, "handlers", []) for s in h.body)]
            out += _module_level(nested)
    return out


def missing_function(path: str | Path, name: str) -> str | None:
    """The problem when the script at ``path`` binds no ``name`` at module level (a star
    import may: then None), else None; read, not imported.

    Example:
        >>> missing_function("keras_examples/deep_mlp.py", "build_model") is None
        True
        >>> print(missing_function("keras_examples/deep_mlp.py", "no_such_fn")[:60])
        keras_examples/deep_mlp.py defines no 'no_such_fn' at module
    """
    try:
        source = Path(path).read_text(encoding="utf-8")
        names = top_level_names(source)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError) as err:
        return f"Cannot read the script {str(path)!r}: {err}."
    if name in names or "import *" in source:
        return None
    functions = sorted(n for n in names if not n.isupper() and not n.startswith("_"))
    return format_error(
        f"{path} defines no {name!r} at module level: there is no model function to call.",
        received=f"{path}:{name}", expected=f"one of the names it defines: {functions}",
        fix="name the function that builds the model, as path/script.py:function")
