"""`tfdist.bench.memory.PeakSampler`: a transient block allocated and freed inside is its peak,
read from the kernel's reset high-water mark or, where the reset is refused, by sampling; nested
samplers each see their own peak and the outer one sees the inner's."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tfdist.bench import memory
from tfdist.bench.memory import PeakSampler, rss_bytes

BLOCK = 48 << 20


def _transient(size: int = BLOCK) -> None:
    """Touches ``size`` bytes (an mmap'd block, returned to the kernel when freed), held 20 ms."""
    block = np.ones(size // 8)
    time.sleep(0.02)
    del block


@pytest.mark.parametrize("kernel_mark", [True, False], ids=["high_water_mark", "sampled"])
def test_a_freed_block_is_the_peak(monkeypatch, kernel_mark):
    if not kernel_mark:
        monkeypatch.setattr(memory, "_reset_high_water_mark", lambda: False)
    elif not memory._reset_high_water_mark():
        pytest.skip("this kernel refuses /proc/self/clear_refs: the sampled variant covers it")
    with PeakSampler() as sampler:
        _transient()
    after = rss_bytes()
    assert after < sampler.peak - 0.9 * BLOCK  # freed: only the peak saw it
    assert (sampler._thread is None) == kernel_mark


def test_nested_samplers_fold_the_inner_peak_into_the_outer():
    with PeakSampler() as outer:
        _transient(2 * BLOCK)
        with PeakSampler() as inner:
            _transient(BLOCK)
        base = rss_bytes()
    assert inner.peak - base == pytest.approx(BLOCK, rel=0.2)  # its reset forgot the outer's
    assert outer.peak - base == pytest.approx(2 * BLOCK, rel=0.2)
    with PeakSampler() as outer:
        with PeakSampler():
            _transient(BLOCK)
    assert outer.peak - rss_bytes() >= 0.9 * BLOCK
