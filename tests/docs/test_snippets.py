"""The code blocks of the README and the manual run (convention: tests/docs/docs_snippets.py)."""

from __future__ import annotations

import re
from pathlib import Path

import docs_snippets as ds
import pytest

PAGES = ds.pages()


@pytest.mark.docs  # out of `make test-fast` (-m unit): the pages train models, 23-32 CPU-s in all
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ds.REPO)) for p in PAGES])
def test_page_blocks_run(page: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    snippets = ds.parse(page.read_text(), str(page.relative_to(ds.REPO)))
    ds.run_page(snippets, ds.make_sandbox(tmp_path))


def test_the_manual_runs_most_of_its_blocks() -> None:
    counts = {"run": 0, "dry-run": 0, "skip": 0}
    for page in PAGES:
        for snippet in ds.parse(page.read_text(), str(page)):
            if snippet.kind != "shown":
                counts[snippet.mode] += 1
    assert counts["run"] + counts["dry-run"] > counts["skip"], counts


def _page(tmp_path: Path, text: str) -> list[ds.Snippet]:
    return ds.parse(text, "broken.md")


def test_a_python_block_that_raises_fails_naming_its_line(tmp_path: Path) -> None:
    snippets = _page(tmp_path, "# t\n\n```python\nx = 1\n```\n\n```python\nassert x == 2\n```\n")
    with pytest.raises(ds.SnippetError, match=r"broken.md:8: python block raised AssertionError"):
        ds.run_page(snippets, ds.make_sandbox(tmp_path))


def test_a_doctest_block_with_the_wrong_output_fails(tmp_path: Path) -> None:
    snippets = _page(tmp_path, "```python\n>>> 1 + 1\n3\n```\n")
    with pytest.raises(ds.SnippetError, match="doctest failed"):
        ds.run_page(snippets, ds.make_sandbox(tmp_path))


def test_a_shell_block_that_exits_nonzero_fails(tmp_path: Path) -> None:
    snippets = _page(tmp_path, "```bash\ntrue\nfalse\necho never\n```\n")
    with pytest.raises(ds.SnippetError, match="shell block exited 1"):
        ds.run_page(snippets, ds.make_sandbox(tmp_path))


def test_a_dry_run_block_with_a_wrong_flag_fails(tmp_path: Path) -> None:
    snippets = _page(tmp_path, "<!-- docs-test: dry-run -->\n```bash\n"
                               "tfdist-launch --workers 2 --no-such-flag train.py\n```\n")
    with pytest.raises(ds.SnippetError, match="no-such-flag"):
        ds.run_page(snippets, ds.make_sandbox(tmp_path))


def test_a_dry_run_block_plans_without_starting_anything(tmp_path: Path) -> None:
    snippets = _page(tmp_path, "<!-- docs-test: dry-run -->\n```bash\n"
                               "L=.venv/bin/tfdist-launch\n$L --ps 1 --workers 2 train.py\n```\n")
    assert ds.run_page(snippets, ds.make_sandbox(tmp_path)) == 1


@pytest.mark.parametrize("text, message", [
    ("<!-- docs-test: skip -->\n```bash\nmake test\n```\n", "needs a reason"),
    ("<!-- docs-test: sometimes x -->\n```bash\nls\n```\n", "unknown docs-test mode"),
    ("<!-- docs-test: skip slow -->\n\nprose\n```bash\nls\n```\n", "right before a fenced block"),
    ("<!-- docs-test: dry-run -->\n```python\nx = 1\n```\n", "shell blocks only"),
    ("<!-- docs-test: skip slow -->\n```text\nx\n```\n", "never runs"),
    ("text\n<!-- docs-test: skip slow -->\n", "end of the page"),
    ("```python\nx = 1\n", "never closed"),
])
def test_markers_that_break_the_convention_are_refused(text: str, message: str) -> None:
    with pytest.raises(ds.SnippetError, match=message):
        ds.parse(text, "broken.md")


def test_a_dry_run_block_refuses_other_commands() -> None:
    with pytest.raises(ds.SnippetError, match="only tfdist-launch lines"):
        ds.dry_run_script("ray start --head\n")


README_LINK = re.compile(r"\]\((?!https?://|#)(?P<target>[^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_links_only_to_files_that_exist() -> None:
    readme = (ds.REPO / "README.md").read_text()
    targets = [m["target"] for m in README_LINK.finditer(readme)]
    assert any(t.startswith("docs/") for t in targets), "the README links into the manual"
    missing = [t for t in targets if not (ds.REPO / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_the_readme_stays_short() -> None:
    lines = (ds.REPO / "README.md").read_text().count("\n")
    assert lines <= 250, f"README.md has {lines} lines; move detail into docs/ (at most 250)"


def test_the_checkers_own_examples_run() -> None:
    import doctest

    result = doctest.testmod(ds, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result
