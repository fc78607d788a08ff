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
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # An int of over 4300 digits; a list nested too deep.
        return f"<a {type(value).__name__} too large to show>"
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
        >>> error = config_error("TF_CONFIG", "bad index.", received="-1", expected=">= 0",
        ...                      fix="Use 0.")
        >>> print(error)
        Invalid TF_CONFIG: bad index. Received: -1. Expected: >= 0. Fix: Use 0.
    """
    problem = f"Invalid {where}: {problem}"
    return ClusterConfigError(format_error(problem, received=received, expected=expected, fix=fix))
