"""Which tests ran while the machine's cores sat idle: where more pytest workers would help.

The suite is CPU-bound on 2 cores, so its wall time is its CPU work over the cores it keeps
busy. `IdleCores` samples ``/proc/stat`` on a thread every `PERIOD` seconds; each interval's idle
core-seconds are shared among the tests running in it (their setup, call and teardown, as
pytest reports them, on any xdist worker). A test that waits (a deadline, a restart, a
cluster starting) shows up with idle time; one that computes while another waits, without.

Example:
    >>> idle = IdleCores(cores=2)
    >>> idle.samples = [(0.0, 0, 0), (10.0, 500, 2000)]  # 10 s, busy 25% of 2 cores
    >>> idle.ran("a", 0.0, 10.0); idle.ran("b", 5.0, 10.0)
    >>> idle.total(), idle.by_test()
    (15.0, [('a', 7.5), ('b', 7.5)])
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from itertools import pairwise

PERIOD = 1.0


def cpu_ticks() -> tuple[int, int]:
    """(busy, all) clock ticks of every CPU since boot (``/proc/stat``; (0, 0) elsewhere)."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


class IdleCores:
    """Idle core-seconds of the machine, shared among the tests running when they occurred."""

    def __init__(self, cores: int, ticks: Callable[[], tuple[int, int]] = cpu_ticks) -> None:
        self.cores, self._ticks = cores, ticks
        self.samples: list[tuple[float, int, int]] = []  # (time.time(), busy, all)
        self.intervals: list[tuple[str, float, float]] = []
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._sample, daemon=True, name="idle-cores").start()

    def stop(self) -> None:
        self._stop.set()

    def _sample(self) -> None:
        while True:
            self.samples.append((time.time(), *self._ticks()))
            if self._stop.wait(PERIOD):
                return

    def ran(self, test: str, start: float, stop: float) -> None:
        """Notes that ``test`` ran from ``start`` to ``stop`` (``time.time()`` seconds)."""
        self.intervals.append((test, start, stop))

    def _idle_intervals(self) -> list[tuple[float, float, float]]:
        """(start, stop, idle core-seconds) of each sampled interval."""
        out = []
        for (t0, busy0, all0), (t1, busy1, all1) in pairwise(self.samples):
            if all1 > all0:
                out.append((t0, t1, (1 - (busy1 - busy0) / (all1 - all0)) * self.cores * (t1 - t0)))
        return out

    def total(self) -> float:
        return sum(idle for _, _, idle in self._idle_intervals())

    def by_test(self) -> list[tuple[str, float]]:
        """(test, idle core-seconds shared to it), most first."""
        shares: defaultdict[str, float] = defaultdict(float)
        for t0, t1, idle in self._idle_intervals():
            if idle <= 0:
                continue
            running = {test for test, start, stop in self.intervals if start < t1 and stop > t0}
            for test in running:
                shares[test] += idle / len(running)
        return sorted(shares.items(), key=lambda item: (-item[1], item[0]))
