"""Checks of option values shared by the strategies and the Horovod layer: one error shape.

It sits below both `tfdist.strategies` and `tfdist.horovod` (neither imports the other for it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tfdist.errors import StrategyConfigError, format_error

__all__ = ["check_choice", "check_positive_int", "check_positive_number"]


def _error(option: str, value: Any, expected: str, fix: str) -> StrategyConfigError:
    return StrategyConfigError(
        format_error(
            f"Invalid value for option {option!r}.",
            received=f"{option}={value!r}",
            expected=expected,
            fix=fix,
        )
    )


def check_choice(option: str, value: Any, choices: Sequence[Any], fix: str) -> Any:
    """Returns ``value`` if it is one of ``choices``, else raises `StrategyConfigError`.

    Example:
        >>> check_choice("implementation", "ring", ("auto", "ring", "nccl"), fix="")
        'ring'
    """
    if value in choices:
        return value
    expected = f"one of {', '.join(repr(c) for c in choices)}"
    raise _error(option, value, expected, fix)


def check_positive_int(option: str, value: Any, *, allow_none: bool = True) -> int | None:
    """Returns ``value`` if it is an int >= 1 (or None when allowed), else raises.

    Example:
        >>> check_positive_int("num_shards", 2)
        2
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _error(option, value, "an int >= 1" + (" or None" if allow_none else ""),
                     f"pass a whole number such as {option}=2, or leave it out")
    return value


def check_positive_number(option: str, value: Any, *, allow_none: bool = True) -> float | None:
    """Returns ``value`` as a float if it is a number > 0 (or None when allowed), else raises.

    Example:
        >>> check_positive_number("timeout_seconds", 30)
        30.0
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise _error(option, value, "a number > 0" + (" or None" if allow_none else ""),
                     f"pass seconds such as {option}=60, or leave it out for no limit")
    return float(value)
