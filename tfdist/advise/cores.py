"""How many cores a job can actually get here: on a shared machine, fewer than it has.

`usable_cores` runs the same pure-Python busy loop in one process, then in ``processes`` at
once, and returns the concurrent work over the single process's (between 1 and ``processes``):
the cores that many processes really share. The advisor's compute term divides by it.

Example:
    >>> 0.5 < usable_cores(1, seconds=0.05) <= 1.0
    True
"""

from __future__ import annotations

import multiprocessing
import time

__all__ = ["usable_cores"]


def _spin(seconds: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    count, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(1000):
            count += 1
    out.put(count)


def _run(processes: int, seconds: float) -> float:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    workers = [context.Process(target=_spin, args=(seconds, out)) for _ in range(processes)]
    for w in workers:
        w.start()
    counts = [out.get(timeout=60 + seconds) for _ in workers]
    for w in workers:
        w.join(timeout=10)
    return float(sum(counts))


def usable_cores(processes: int, seconds: float = 0.5) -> float:
    """The cores ``processes`` busy processes get together here (1.0 to ``processes``)."""
    if processes <= 1:
        return 1.0
    alone = _run(1, seconds)
    together = _run(processes, seconds)
    return min(float(processes), max(1.0, together / alone))
