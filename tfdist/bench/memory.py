"""Resident memory of this process: now, and the peak while a block runs.

The pipeline's memory measurements (the benchmark's recomputation rows, the memory tests) read
``/proc/self/statm`` from a thread every millisecond. Run such a process with
``MALLOC_MMAP_THRESHOLD_`` set low (`MALLOC_ENV`): glibc then returns each large freed block at
once, so resident memory follows what is allocated (by default it raises the threshold to 32 MB
after the first large free and keeps freed blocks resident). ``MALLOC_ARENA_MAX`` caps glibc's
per-thread arenas, each of which keeps its own freed small blocks resident (the memory test's
stages at load 7-10: 140 / 146 MB with 2 arenas, 143 / 149 MB with 64).

Example:
    >>> with PeakSampler() as sampler:
    ...     block = bytearray(8 << 20)
    >>> sampler.peak >= rss_bytes() - (1 << 20) and sampler.peak > 0
    True
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

__all__ = ["MALLOC_ENV", "rss_bytes", "PeakSampler"]

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_ARENA_MAX": "2"}
"""The environment under which resident memory follows allocation (see above)."""


def rss_bytes() -> int:
    """This process's resident memory now."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakSampler:
    """The highest resident memory seen while inside (``peak``, sampled every millisecond)."""

    def __enter__(self) -> PeakSampler:
        self.peak, self._done = rss_bytes(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.001)

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())
