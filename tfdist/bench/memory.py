"""Resident memory of this process: now, and the peak while a block runs.

The pipeline's memory measurements (the benchmark's recomputation rows, the memory tests) read
the kernel's high-water mark of this process's resident memory (``VmHWM``), reset as a block
starts (``/proc/self/clear_refs``): exact, and free while the block runs. Where that reset is not
allowed, a thread reads ``/proc/self/statm`` every millisecond instead (8% of a core, and a
GIL it takes from the traced step 1,000 times a second). Run such a process with
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


def _high_water_mark() -> int:
    """The highest resident memory since this process started or `_reset_high_water_mark`."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("/proc/self/status has no VmHWM line")


def _reset_high_water_mark() -> bool:
    """Sets the high-water mark to the resident memory now (Linux 4.0+); False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        _high_water_mark()
    except OSError:
        return False
    return True


class PeakSampler:
    """The highest resident memory seen while inside (``peak``): the kernel's high-water mark
    reset on entry, or, where the kernel refuses the reset, a sample every millisecond.

    Samplers may nest: an inner one's reset first folds the mark so far into the outer ones,
    and its peak is folded into them on exit.
    """

    _active: list[PeakSampler] = []

    def __enter__(self) -> PeakSampler:
        self.peak = rss_bytes()
        self._thread = None
        if PeakSampler._active and PeakSampler._active[-1]._thread is None:
            self._fold(_high_water_mark())
        if not _reset_high_water_mark():
            self._done = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        PeakSampler._active.append(self)
        return self

    def _sample(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.001)

    @staticmethod
    def _fold(peak: int) -> None:
        for sampler in PeakSampler._active:
            sampler.peak = max(sampler.peak, peak)

    def __exit__(self, *exc: Any) -> None:
        if self._thread is None:
            self.peak = max(self.peak, _high_water_mark())
        else:
            self._done.set()
            self._thread.join()
        self.peak = max(self.peak, rss_bytes())
        PeakSampler._active.remove(self)
        self._fold(self.peak)
