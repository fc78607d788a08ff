"""The time a ``python -m tfdist.bench advise --quick`` run may take, what it skipped, and how
noisy the machine was while it ran: the note under its table (`tfdist.bench.advise`)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["QUICK_BUDGET_S", "QUICK_JOB_TIMEOUT_S", "Budget", "machine_noise"]

QUICK_BUDGET_S = 420.0
"""``--quick``: once this many seconds have passed, no new job starts; the table shows what
ran and the note names what was skipped (the run before the budget took over 900 s on a quiet
machine, and was still in its second example after 19 minutes at load 10-16)."""
QUICK_JOB_TIMEOUT_S = 180.0
"""``--quick``: a job that runs longer (a machine too busy) is noted as failed, not waited for."""


class Budget:
    """The time a ``--quick`` run may take (`QUICK_BUDGET_S`), and what it skipped.

    Example:
        >>> budget = Budget(None)
        >>> budget.allows("image: default x1"), budget.skipped
        (True, [])
        >>> spent = Budget(0.0)
        >>> spent.allows("lm: tensor T=2"), spent.skipped
        (False, ['lm: tensor T=2'])
    """

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.started = time.monotonic()
        self.skipped: list[str] = []
        self.failed: list[str] = []
        self.measured = 0

    def allows(self, what: str, first_row: bool = False) -> bool:
        """Whether ``what`` may start; else it is recorded as skipped. ``first_row``: a
        candidate's run, which starts whatever the time while no row was measured, so the
        table has one."""
        if first_row and not self.measured:
            return True
        if self.seconds is None or time.monotonic() - self.started < self.seconds:
            return True
        self.skipped.append(what)
        return False

    def note(self) -> str:
        """What the budget left out, for the note under the table ('' when nothing)."""
        parts = []
        if self.skipped:
            parts.append(f" Time budget of {self.seconds:g} s spent: skipped "
                         f"{', '.join(self.skipped)}.")
        if self.failed:
            parts.append(f" Failed or timed out (a busy machine): {'; '.join(self.failed)}.")
        return "".join(parts)


def machine_noise(rows: Sequence[Mapping[str, Any]], seconds: float) -> str:
    """How noisy the machine was during the runs: the 1-minute load average's range and how
    far one example's reference step moved between its runs (the same one-process job).

    Example:
        >>> text = machine_noise([{"example": "a", "load": 1.0, "reference_ms": 10.0},
        ...                       {"example": "a", "load": 3.0, "reference_ms": 13.0}], 120.0)
        >>> "load 1.0-3.0 during the runs" in text, "moved up to 30% within" in text
        (True, True)
    """
    loads = [r["load"] for r in rows if "load" in r]
    if not loads:
        return (f" Machine: {seconds:.0f} s; no run measured; load {os.getloadavg()[0]:.1f} at "
                "the end.")
    moved = [max(refs) / min(refs) - 1 for name in {r["example"] for r in rows}
             if len(refs := [r["reference_ms"] for r in rows
                             if r["example"] == name and r.get("reference_ms")]) > 1]
    spread = (f"; the reference step moved up to {max(moved):.0%} within an example"
              if moved else "")
    return (f" Machine: {seconds:.0f} s; load {min(loads):.1f}-{max(loads):.1f} during the "
            f"runs{spread}.")
