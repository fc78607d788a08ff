"""The manual builds with warnings as errors; the same settings catch a broken link.

The whole build (`make docs`) imports TensorFlow for the API reference and takes tens of
seconds on 2 cores, so it is marked ``slow`` (out of ``-m unit``) and ``docs``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from docs_snippets import REPO

MKDOCS = [sys.executable, "-m", "mkdocs", "build", "--strict"]


def _env() -> dict[str, str]:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MKDOCS, "-f", str(config), "-d", str(site)], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.docs
def test_the_manual_builds_with_no_warning(tmp_path: Path) -> None:
    result = _build(REPO / "mkdocs.yml", tmp_path / "site")
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    assert "WARNING -" not in log, log[-4000:]
    api = (tmp_path / "site" / "reference" / "api.html").read_text()
    # Docstring examples are code blocks with their output on its own line, not nested block
    # quotes (griffe reads only "Examples:"; docs/hooks/griffe_examples.py renames "Example:").
    assert "<blockquote>" not in api
    examples = api.split('doc-section-title">Examples:</span></p>')[1:]
    assert len(examples) >= 60
    assert all('<div class="highlight"><pre>' in e[:500] for e in examples)
    assert '<span class="go">1</span>' in api  # get_strategy("default").num_replicas_in_sync
    # Opened as a file, search works: the offline plugin inlines the index as a script.
    assert (tmp_path / "site" / "search" / "search_index.js").exists()


def _broken_site(tmp_path: Path, page: str) -> Path:
    """The real mkdocs.yml (strict, link and anchor validation, the API hook) on one page."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n## Real section\n")
    (docs / "page.md").write_text(page)
    config.update(docs_dir=str(docs), nav=["index.md", "page.md"], plugins=["search"],
                  hooks=[str(REPO / "docs" / "hooks" / "api.py")])
    path = tmp_path / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("page, message", [
    ("# P\n\nSee [missing](nowhere.md).\n", "nowhere.md"),
    ("# P\n\nSee [a section](index.md#no-such-section).\n", "no-such-section"),
    ("# P\n\n::: tfdist.no_such_name\n", "not a public name"),
])
def test_a_broken_link_or_api_name_fails_the_build(tmp_path: Path, page: str, message: str) -> None:
    result = _build(_broken_site(tmp_path, page), tmp_path / "site")
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
