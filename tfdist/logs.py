"""tfdist's own messages in a launched task: its info lines, and what it wrote, for the launcher.

tfdist logs what it decides ("tfdist chose strategy 'multi_worker': ...", the tensor and pipeline
plans) on the ``tfdist`` logger at INFO. A script that never configures Python's logging would
not see them, so ``tfdist-launch`` sets `LOG_LEVEL_ENV` in every task (``INFO``; ``WARNING`` with
``--quiet``) and `configure_from_env`, run when ``tfdist`` is imported, gives the logger a handler
that prints ``tfdist: <message>`` to stderr. The handler stays silent once the script configures
logging itself (a root handler exists), so no line is printed twice. The launcher's default view
shows the chief's lines only (`tfdist.launcher.output`): one copy per job, not one per task.

`report_written` prints a `WROTE_MARKER` line where a task saved something the user keeps (the
model, a backup directory, TensorBoard logs) when `REPORT_ENV` is set (the launcher sets it); the
launcher hides those lines and names what was written in its last line.

Example:
    >>> written_line("model", "/runs/m.keras")
    'tfdist-wrote: model /runs/m.keras'
    >>> parse_written("tfdist-wrote: model /runs/m.keras")
    ('model', '/runs/m.keras')
    >>> parse_written("Epoch 1/2") is None
    True
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

__all__ = ["LOG_LEVEL_ENV", "REPORT_ENV", "WROTE_MARKER", "configure_from_env", "parse_written",
           "report_written", "written_line"]

LOG_LEVEL_ENV = "TFDIST_LOG_LEVEL"
"""A level name (``INFO``, ``WARNING``...): the ``tfdist`` logger prints from that level on."""

REPORT_ENV = "TFDIST_REPORT_WRITTEN"
"""``1``: `report_written` prints its `WROTE_MARKER` lines (the launcher reads them)."""

WROTE_MARKER = "tfdist-wrote:"
"""Start of the line a task prints once it has written something the user keeps."""

_LOGGER = "tfdist"


class _UnlessConfigured(logging.StreamHandler):  # type: ignore[type-arg]
    """Prints to the stream of the moment (stderr) while the root logger has no handler."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("tfdist: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return  # the script configured logging: the record reaches its handlers instead
        self.stream = sys.stderr
        super().emit(record)


def configure_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Gives the ``tfdist`` logger the level `LOG_LEVEL_ENV` names and a handler; True if set.

    Does nothing when the variable is unset or empty (a script run alone, as before), or when
    the handler is already there.

    Example:
        >>> configure_from_env({})
        False
    """
    env = os.environ if environ is None else environ
    level = env.get(LOG_LEVEL_ENV, "").strip().upper()
    if not level or not isinstance(logging.getLevelName(level), int):
        return False
    logger = logging.getLogger(_LOGGER)
    logger.setLevel(level)
    if not any(isinstance(handler, _UnlessConfigured) for handler in logger.handlers):
        logger.addHandler(_UnlessConfigured())
    return True


def written_line(what: str, path: str | os.PathLike[str]) -> str:
    """The `WROTE_MARKER` line for ``what`` (``model``, ``backups``, ``TensorBoard``) at
    ``path``."""
    return f"{WROTE_MARKER} {what} {os.fspath(path)}"


def parse_written(line: str) -> tuple[str, str] | None:
    """``(what, path)`` of a `WROTE_MARKER` line, else None."""
    if not line.startswith(WROTE_MARKER):
        return None
    what, _, path = line[len(WROTE_MARKER):].strip().partition(" ")
    return (what, path) if path else None


def report_written(what: str, path: str | os.PathLike[str]) -> None:
    """Prints `written_line` to stdout when the launcher asked for it (`REPORT_ENV`)."""
    if os.environ.get(REPORT_ENV) == "1":
        print(written_line(what, os.path.abspath(os.fspath(path))), flush=True)
