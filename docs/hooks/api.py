"""MkDocs hook: the API reference names public objects; this finds where they are defined.

A page writes ``::: tfdist.get_strategy`` (the name a user imports). Many public names are
re-exported or loaded lazily by the package's ``__getattr__``, which mkdocstrings cannot follow
statically, and the modules behind them move. So before mkdocstrings reads a page, each
``::: public.name`` line becomes ``::: defining.module.qualname`` with the public name as its
heading, resolved by importing the name as a user would.

``<!-- cli: tfdist-launch -->`` becomes that console script's ``--help`` text, from its entry
point, so the command-line reference is the parser itself.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import io
import re
import types
from typing import Any

DIRECTIVE = re.compile(r"^::: (?P<name>tfdist(?:\.\w+)*)[ \t]*$", re.MULTILINE)
CLI = re.compile(r"^<!-- cli: (?P<script>[\w-]+) -->[ \t]*$", re.MULTILINE)


def resolve(public: str) -> str:
    """Returns the dotted path where the object named ``public`` is defined.

    Example: ``resolve("tfdist.ClusterSpec")`` is ``"tfdist.cluster.spec.ClusterSpec"``.
    """
    parts = public.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError as error:
            raise ValueError(f"API reference: {public!r} is not a public name. Received: "
                             f"::: {public}. Expected: a name in its package's __all__. Fix: "
                             "correct the name, or drop the line if it was removed.") from error
        break
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    return f"{obj.__module__}.{obj.__qualname__}"


def help_text(script: str) -> str:
    """Returns what ``SCRIPT --help`` prints, by calling its console-script entry point."""
    (entry,) = importlib.metadata.entry_points(group="console_scripts", name=script)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        entry.load()(["--help"])
    return out.getvalue()


def _directive(match: re.Match[str]) -> str:
    public = match["name"]
    path = resolve(public)
    return f"::: {path}\n    options:\n      heading: \"{public}\"\n      toc_label: \"{public}\""


def _cli(match: re.Match[str]) -> str:
    return f"```text\n{help_text(match['script']).rstrip()}\n```"


def on_page_markdown(markdown: str, **_: Any) -> str:
    markdown = DIRECTIVE.sub(_directive, markdown)
    return CLI.sub(_cli, markdown)
