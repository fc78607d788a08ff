"""How many cores a job can actually get here, and how fast: on a shared machine, less than it has.

`usable_cores` runs the same pure-Python busy loop in one process, then in ``processes`` at
once, and returns the concurrent work over the single process's (between 1 and ``processes``):
the cores that many processes really share. The advisor's compute term divides by it.

`spin_rate` is the loop's work per second of one of ``processes`` busy processes; against the
rate taken while the model was profiled, `relative_speed` says how much faster (> 1) or slower
(< 1) a process computes now: the machine's other load moves between the profile and the jobs.
The advisor's compute term divides by it too (`Cluster.speed`).

Example:
    >>> 0.5 < usable_cores(1, seconds=0.05) <= 1.0
    True
    >>> relative_speed(2e6, now=1e6)   # the loop does half the work it did at profile time
    0.5
"""

from __future__ import annotations

import multiprocessing
import time

__all__ = ["usable_cores", "cores_and_rate", "spin_rate", "relative_speed"]


def _spin(seconds: float, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    count, start = 0, time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        for _ in range(1000):
            count += 1
    out.put(count / (time.perf_counter() - start))


def _run(processes: int, seconds: float) -> float:
    """The busy loop's work per second, summed over ``processes`` running at once."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    workers = [context.Process(target=_spin, args=(seconds, out)) for _ in range(processes)]
    for w in workers:
        w.start()
    rates = [out.get(timeout=60 + seconds) for _ in workers]
    for w in workers:
        w.join(timeout=10)
    return float(sum(rates))


def usable_cores(processes: int, seconds: float = 0.5) -> float:
    """The cores ``processes`` busy processes get together here (1.0 to ``processes``)."""
    return cores_and_rate(processes, seconds)[0]


def cores_and_rate(processes: int, seconds: float = 0.5) -> tuple[float, float]:
    """(`usable_cores` of ``processes``, the `spin_rate` of one process alone), from one
    reading of each: the load now, for `Cluster.cores` and (against the profile's rate)
    `Cluster.speed`.

    Example:
        >>> cores, rate = cores_and_rate(1, seconds=0.05)
        >>> cores, rate > 0
        (1.0, True)
    """
    alone = _run(1, seconds)
    if processes <= 1:
        return 1.0, alone
    together = _run(processes, seconds)
    return min(float(processes), max(1.0, together / alone)), alone


def spin_rate(processes: int = 1, seconds: float = 0.5) -> float:
    """The busy loop's work per second of one of ``processes`` processes busy at once.

    Example:
        >>> spin_rate(1, seconds=0.05) > 0
        True
    """
    return _run(max(1, processes), seconds) / max(1, processes)


def relative_speed(reference: float, now: float) -> float:
    """A process's speed ``now`` against ``reference`` (two `spin_rate` readings)."""
    return now / reference
