"""The advisor's network probe for real: 2 processes, tiny sizes, bounded time; the fitted
alpha-beta-gamma constants reproduce the all-reduce times they were fitted to."""

from __future__ import annotations

import time

import pytest

from tfdist.advise import model, network

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


def test_probe_fits_constants_that_predict_the_measured_allreduce(tmp_path):
    start = time.monotonic()
    # Sizes up to 8 MiB: there the bandwidth term (~7 ms) stands above a loaded machine's noise.
    net = network.probe(backends=("tf",), p=2, sizes=(64 << 10, 1 << 20, 8 << 20), repeats=3,
                        timeout=180)
    assert time.monotonic() - start < 180
    tf_link = net.link("tf")
    assert 1e-6 < tf_link.alpha < 0.1, tf_link
    assert 0.01 < tf_link.bandwidth_gbps < 100, tf_link
    assert 0.05 < net.p2p.bandwidth_gbps < 200, net.p2p
    assert 0 < net.gamma < 1e-8
    # Each measured all-reduce time against the ring formula with the fitted constants, within a
    # factor of 3: a probe that mixed up bits and bytes would be 8x off, one that mixed up sizes or
    # seconds and milliseconds by orders of magnitude. A tighter band fails on a shared machine:
    # CI once saw the 64 KiB point, where the latency term dominates, 1.5x off the fitted line.
    for nbytes, seconds in net.samples["tf"]:
        predicted = model.ring_allreduce_s(2, nbytes, tf_link)
        assert seconds / 3 < predicted < seconds * 3, (nbytes, seconds, predicted, tf_link)
    assert network.load(network.save(net, tmp_path / "net.json")) == net
