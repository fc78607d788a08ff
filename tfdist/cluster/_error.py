"""The one way this package builds a `ClusterConfigError` (private helper)."""

from __future__ import annotations

from tfdist.errors import ClusterConfigError, format_error

__all__ = ["config_error", "show"]

_MAX_SHOWN = 120


def show(value: object) -> str:
    """Returns ``repr(value)``, shortened to keep error messages to one or two sentences.

    Example:
        >>> show("worker")
        "'worker'"
    """
    text = repr(value)
    if len(text) > _MAX_SHOWN:
        text = text[: _MAX_SHOWN - 3] + "..."
    return text


def config_error(
    where: str, problem: str, *, received: object, expected: str, fix: str
) -> ClusterConfigError:
    """Returns (does not raise) a `ClusterConfigError` in the standard three-part form.

    Args:
        where: What was being read, e.g. ``"TF_CONFIG"`` or ``"cluster spec"``.
        problem: One clause naming the field and what is wrong with it.
        received: The offending value, already formatted (see `show`).
        expected: What would have been valid.
        fix: One imperative sentence.

    Example:
        >>> str(config_error("TF_CONFIG", "task.index is negative.", received="-1",
        ...                  expected="an integer >= 0", fix="Use 0."))
        'Invalid TF_CONFIG: task.index is negative. Received: -1. Expected: an integer >= 0. Fix: Use 0.'
    """
    message = format_error(f"Invalid {where}: {problem}", received=received, expected=expected, fix=fix)
    return ClusterConfigError(message)
