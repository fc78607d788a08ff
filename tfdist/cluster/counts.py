"""The one check that a count (of tasks, slots, nodes or instances) is a whole number in range.

Every count that `tfdist.cluster` turns into a list is at most `MAX_TASKS`: the tasks of a role
(``workers``, ``ps``, a PAI ``inst_num``), the slots of a host (``h1:2``, ``slots=2``,
``max_slots=4``, Slurm's tasks per node), and the nodes of a Slurm node list. A typo or a hostile
value (``node[1-100000000]``, ``inst_num=1e9``) then fails at once with a clear message, instead
of growing memory for minutes. The bound is far above any cluster tfdist can start: each task is
one process with its own TCP port.
"""

from __future__ import annotations

from tfdist.cluster._error import config_error, show

__all__ = ["MAX_TASKS", "is_whole_number", "check_count", "parse_count"]

MAX_TASKS = 10_000
"""The largest count of tasks per role, slots per host, or nodes of a Slurm node list."""


def is_whole_number(text: str) -> bool:
    """True for an ASCII decimal string such as ``"2222"`` (no sign, no spaces).

    Example:
        >>> is_whole_number("2222"), is_whole_number("-1"), is_whole_number("2.0")
        (True, False, False)
    """
    return text.isascii() and text.isdigit()


def check_count(
    value: object,
    field: str,
    where: str,
    *,
    minimum: int = 0,
    maximum: int = MAX_TASKS,
    fix: str | None = None,
    received: str | None = None,
) -> int:
    """Returns ``value`` if it is an int in ``minimum..maximum``, else raises `ClusterConfigError`.

    Args:
        value: The count (bools, floats and strings are refused).
        field: What it counts, for the message (e.g. ``"workers"``).
        where: What was being read (e.g. ``"host layout"``).
        minimum: The smallest valid count.
        maximum: The largest valid count (default `MAX_TASKS`).
        fix: The fix for a value that is not a count or too small (default: pass ``minimum``).
        received: How to show the value (default ``field=value``).

    Example:
        >>> check_count(2, "workers", "host layout")
        2
        >>> check_count(-1, "ps", "host layout")
        Traceback (most recent call last):
        ...
        tfdist.errors.ClusterConfigError: Invalid host layout: ps must be an integer >= 0. \
Received: ps=-1. Expected: an integer in 0..10000. Fix: Pass ps=1 (or another count).
    """
    shown = f"{field}={show(value)}" if received is None else received
    expected = f"an integer in {minimum}..{maximum}"
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise config_error(
            where, f"{field} must be an integer >= {minimum}.", received=shown, expected=expected,
            fix=fix or f"Pass {field}={max(minimum, 1)} (or another count).",
        )
    if value > maximum:
        why = " (tfdist.cluster.MAX_TASKS)" if maximum == MAX_TASKS else ""
        raise config_error(
            where, f"{field} is larger than {maximum}{why}.", received=shown, expected=expected,
            fix=f"Check the value for a typo; use at most {maximum}.",
        )
    return value


def parse_count(
    text: str,
    field: str,
    where: str,
    *,
    minimum: int = 1,
    maximum: int = MAX_TASKS,
    fix: str | None = None,
    received: str | None = None,
) -> int:
    """Like `check_count`, for a count written as text (``"2"``); the message shows the text.

    Digit strings too long to convert are refused as too large, without converting them.

    Example:
        >>> parse_count(" 4 ", "slots", "hostfile")
        4
        >>> parse_count("99999999999999999999999", "slots", "hostfile")
        Traceback (most recent call last):
        ...
        tfdist.errors.ClusterConfigError: Invalid hostfile: slots is larger than 10000 \
(tfdist.cluster.MAX_TASKS). Received: '99999999999999999999999'. Expected: an integer in \
1..10000. Fix: Check the value for a typo; use at most 10000.
    """
    stripped = text.strip()
    value: object = stripped
    if is_whole_number(stripped):
        digits = stripped.lstrip("0") or "0"
        value = int(digits) if len(digits) <= len(str(maximum)) else maximum + 1
    shown = show(text) if received is None else received
    return check_count(
        value, field, where, minimum=minimum, maximum=maximum, fix=fix, received=shown
    )
