"""Runs the code blocks of the manual and the README, so the pages cannot drift from the code.

The convention (also in docs/about-docs.md):

* A fenced ``python`` block runs. The blocks of one page run in order in one namespace, so a
  later block may use what an earlier one defined. A block that starts with ``>>>`` is a
  doctest: its printed output must match.
* A fenced ``bash`` (or ``sh``/``shell``) block runs with ``bash -e`` and must exit 0.
* ``<!-- docs-test: dry-run -->`` on the line before a shell block: each ``tfdist-launch`` line
  in it runs with ``--dry-run`` added (plans the job, checks every flag, starts nothing); the
  block may hold nothing else but variable assignments. A line with ``--export``, ``--check``,
  ``--help`` or ``--dry-run`` runs as written.
* ``<!-- docs-test: skip REASON -->`` on the line before a block: not run; the reason is
  required (a cluster, a GPU, minutes of training, a fragment with ``...``).
* Blocks in any other language (``text``, ``yaml``, ``json``) are shown, never run.

Every block runs in a sandbox directory holding an empty-ish ``train.py``, a ``hosts.txt`` and
links to the repository's ``keras_examples/``, ``tests/`` and the virtual environment
(``.venv``), with this checkout first on ``PYTHONPATH``.
"""

from __future__ import annotations

import contextlib
import doctest
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUN_LANGS = {"python": "python", "py": "python", "bash": "shell", "sh": "shell", "shell": "shell"}
MODES = ("skip", "dry-run")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,})(?P<lang>[\w-]*)")
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<mode>[\w-]*)\s*(?P<reason>.*?)\s*-->\s*$")
LAUNCH_FLAGS_AS_WRITTEN = ("--dry-run", "--export", "--check", "--help")
SHELL_TIMEOUT_S = 120


class SnippetError(AssertionError):
    """A block that failed, or a marker that breaks the convention; names the page and line."""


@dataclass(frozen=True)
class Snippet:
    """One fenced block: where it is, its language kind, its code and how it runs."""

    path: str
    line: int
    kind: str  # "python", "shell" or "shown"
    code: str
    mode: str  # "run", "skip" or "dry-run"
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def parse(text: str, path: str = "<page>") -> list[Snippet]:
    """Returns a page's fenced blocks; raises SnippetError for a marker the convention refuses.

    Example:
        >>> page = "<!-- docs-test: skip needs a cluster -->\\n```bash\\nmake test\\n```\\n"
        >>> [(s.kind, s.mode, s.reason) for s in parse(page)]
        [('shell', 'skip', 'needs a cluster')]
    """
    lines = text.splitlines()
    snippets, pending, i = [], None, 0
    while i < len(lines):
        marker, fence = MARKER.match(lines[i]), FENCE.match(lines[i])
        if pending and not fence:
            raise SnippetError(f"{path}:{pending[0]}: a docs-test marker must be on the line "
                               f"right before a fenced block. Received: {lines[i]!r}")
        if marker:
            pending = (i + 1, _check_marker(marker, path, i + 1))
        elif fence:
            end = _fence_end(lines, i, fence, path)
            kind = RUN_LANGS.get(fence["lang"], "shown")
            mode, reason = pending[1] if pending else ("run", "")
            if mode == "dry-run" and kind != "shell":
                raise SnippetError(f"{path}:{i + 1}: 'dry-run' applies to shell blocks only. "
                                   f"Received a {fence['lang'] or 'plain'} block.")
            if pending and kind == "shown":
                raise SnippetError(f"{path}:{i + 1}: a docs-test marker before a "
                                   f"{fence['lang'] or 'plain'} block, which never runs: drop it.")
            code = "\n".join(_dedent(lines[i + 1:end], fence["indent"]))
            snippets.append(Snippet(path, i + 2, kind, code + "\n", mode, reason))
            pending, i = None, end
        i += 1
    if pending:
        raise SnippetError(f"{path}:{pending[0]}: a docs-test marker at the end of the page, "
                           "with no block after it.")
    return snippets


def _check_marker(marker: re.Match[str], path: str, line: int) -> tuple[str, str]:
    mode, reason = marker["mode"], marker["reason"]
    if mode not in MODES:
        raise SnippetError(f"{path}:{line}: unknown docs-test mode {mode!r}. "
                           f"Expected one of {', '.join(MODES)}.")
    if mode == "skip" and not reason:
        raise SnippetError(f"{path}:{line}: 'docs-test: skip' needs a reason "
                           "(<!-- docs-test: skip needs a Slurm cluster -->).")
    return mode, reason


def _fence_end(lines: list[str], start: int, fence: re.Match[str], path: str) -> int:
    closing = fence["indent"] + fence["ticks"]
    for j in range(start + 1, len(lines)):
        if lines[j].rstrip() == closing or lines[j].strip() == fence["ticks"]:
            return j
    raise SnippetError(f"{path}:{start + 1}: a fenced block that is never closed.")


def _dedent(body: list[str], indent: str) -> list[str]:
    return [line[len(indent):] if line.startswith(indent) else line for line in body]


def dry_run_script(code: str, where: str = "<block>") -> str:
    """Rewrites a dry-run block: ``--dry-run`` after each ``tfdist-launch``; nothing else runs.

    Example:
        >>> block = "L=.venv/bin/tfdist-launch\\n$L --workers 2 train.py  # 2\\n"
        >>> print(dry_run_script(block), end="")
        L=.venv/bin/tfdist-launch
        $L --dry-run --workers 2 train.py  # 2
    """
    launchers, out = {"tfdist-launch"}, []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            out.append(line)
        elif len(words) == 1 and re.fullmatch(r"\w+=\S+", words[0]):
            name, value = words[0].split("=", 1)
            if value.endswith("tfdist-launch"):
                launchers.add(f"${name}")
            out.append(line)
        elif words[0] in launchers or words[0].endswith("/tfdist-launch"):
            if not any(flag in words for flag in LAUNCH_FLAGS_AS_WRITTEN):
                first = line.index(words[0]) + len(words[0])
                line = f"{line[:first]} --dry-run{line[first:]}"
            out.append(line)
        else:
            raise SnippetError(f"{where}: a dry-run block may hold only tfdist-launch lines and "
                               f"assignments. Received: {line.strip()!r}. Fix: move it to a "
                               "block of its own, run or marked skip.")
    return "\n".join(out) + "\n"


def make_sandbox(directory: Path) -> Path:
    """Fills ``directory`` with what the pages' commands expect to find; returns it."""
    (directory / "train.py").write_text('print("train.py: a stand-in training script")\n')
    (directory / "hosts.txt").write_text("node1:2\nnode2 slots=2\n")
    for name in ("keras_examples", "tests", "launch"):
        (directory / name).symlink_to(REPO / name)
    (directory / ".venv").symlink_to(Path(sys.executable).parent.parent)
    return directory


def shell_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TFDIST_LAUNCH_VERBOSE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def run_shell(snippet: Snippet, cwd: Path) -> None:
    code = snippet.code
    if snippet.mode == "dry-run":
        code = dry_run_script(code, snippet.where)
    result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=cwd, env=shell_env(),
                            capture_output=True, text=True, timeout=SHELL_TIMEOUT_S)
    if result.returncode != 0:
        raise SnippetError(f"{snippet.where}: shell block exited {result.returncode}.\n"
                           f"--- ran ---\n{code}--- output ---\n{result.stdout[-2000:]}"
                           f"{result.stderr[-3000:]}")


def run_python(snippet: Snippet, namespace: dict) -> None:
    if snippet.code.lstrip().startswith(">>>"):
        _run_doctest(snippet, namespace)
        return
    try:
        exec(compile(snippet.code, snippet.where, "exec"), namespace)  # the page's own code
    except Exception as error:
        raise SnippetError(f"{snippet.where}: python block raised {error!r}") from error


def _run_doctest(snippet: Snippet, namespace: dict) -> None:
    test = doctest.DocTestParser().get_doctest(snippet.code, namespace, snippet.where,
                                               snippet.path, snippet.line)
    report = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test, out=report.append, clear_globs=False)
    if runner.failures:
        raise SnippetError(f"{snippet.where}: doctest failed\n{''.join(report)}")


def run_page(snippets: list[Snippet], sandbox: Path) -> int:
    """Runs a page's blocks in order in ``sandbox``; returns how many ran."""
    namespace: dict = {"__name__": "__docs__"}
    ran = 0
    with _chdir(sandbox):
        for snippet in snippets:
            if snippet.mode == "skip" or snippet.kind == "shown":
                continue
            if snippet.kind == "python":
                run_python(snippet, namespace)
            else:
                run_shell(snippet, sandbox)
            ran += 1
    return ran


@contextlib.contextmanager
def _chdir(path: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def pages() -> list[Path]:
    """The README and every page of the manual."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
