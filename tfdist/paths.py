"""Whether a path can be written, asked before the work that would write it.

A directory a callback writes after the first epoch, or a file saved after training, must be
checked when the script names it: found only at the write, the error costs the training.

Example:
    >>> import tempfile
    >>> directory_problem(tempfile.mkdtemp()) is None
    True
    >>> directory_problem("/proc/version/backups")
    "'/proc/version' is a file, not a directory"
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["directory_problem", "file_problem"]


def directory_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be (created as) a writable directory; None when it can.

    Nothing is created: the nearest existing ancestor must be a writable directory.
    """
    target = Path(path).absolute()
    if target.exists():
        if not target.is_dir():
            return f"{str(target)!r} is a file, not a directory"
        return None if os.access(target, os.W_OK | os.X_OK) else f"{str(target)!r} is not writable"
    return _ancestor_problem(target.parent)


def file_problem(path: str | os.PathLike[str]) -> str | None:
    """Why a file cannot be written at ``path`` (its directories created); None when it can."""
    target = Path(path).absolute()
    if target.is_dir():
        return f"{str(target)!r} is a directory"
    return _ancestor_problem(target.parent)


def _ancestor_problem(directory: Path) -> str | None:
    existing = directory
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{str(existing)!r} is a file, not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{str(existing)!r} is not writable"
    return None
