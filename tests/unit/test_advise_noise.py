"""The advisor's measurement on a noisy machine (issue 41, root 6): a probe whose larger
exchanges were not slower is bounded and reported as noise, not refused; a cached fit with a
negative slope (1,000,000 GB/s) is refitted when read; a fractional core count is accepted;
``--cluster -1`` and a build function that does not exist are refused before anything runs."""

from __future__ import annotations

import json

import pytest

from tfdist.advise import network
from tfdist.advise.candidates import Cluster
from tfdist.advise.cli import main, parse_args
from tfdist.advise.model import Link
from tfdist.errors import AdviseError

NOISY_TCP = [[16384, 2.0e-4], [262144, 1.5e-4], [1048576, 1.2e-4]]
"""The larger, the faster: the other load decided these times (the probe once failed on them)."""
CLEAN = [[16384, 1.0e-4], [262144, 3.0e-4], [1048576, 9.0e-4]]


def test_a_noisy_probe_is_bounded_and_named_not_refused():
    net = network.fit_constants({"tcp": NOISY_TCP, "tf": CLEAN}, 2, 1e-10, {})
    # bounded by the largest exchange: 1 MiB in 0.12 ms
    assert net.p2p.bandwidth_gbps == pytest.approx(1048576 / 1.2e-4 / 1e9)
    assert net.p2p.alpha == 0.0
    assert len(net.noise) == 1 and "TCP exchange times did not grow" in net.noise[0]
    assert net.link("tf").bandwidth_gbps < 10


def test_a_clean_probe_has_no_noise():
    net = network.fit_constants({"tcp": CLEAN, "tf": CLEAN}, 2, 1e-10, {})
    assert net.noise == () and net.p2p.bandwidth_gbps < 10


def test_a_negative_slope_all_reduce_fit_is_a_bound_not_a_million_gb_per_s():
    link, noisy = network.fit_ring_noted([16384, 1048576], [3e-3, 2e-3], p=2, gamma=1e-10)
    assert noisy and link.bandwidth_gbps < network.IMPLAUSIBLE_GBPS
    # all of the largest all-reduce's 2 ms taken as transfer (less the reduction's share)
    assert link.bandwidth_gbps == pytest.approx(1e-9 / (2e-3 / 1048576 - 0.5e-10))


def test_a_cached_million_gb_per_s_link_is_refitted_when_read(tmp_path):
    stale = network.Constants(
        Link(1e-4, 1e-9), {"horovod": Link(1e-4, 1e-15), "tf": Link(1e-4, 2e-9)}, 1e-10, 2,
        {}, {"horovod": [[16384, 3e-3], [1048576, 2e-3]], "tcp": CLEAN})
    assert stale.link("horovod").bandwidth_gbps == pytest.approx(1e6)  # what was cached
    path = tmp_path / "net.json"
    path.write_text(json.dumps(stale.to_json()))
    read = network.load(path)
    assert read.link("horovod").bandwidth_gbps < network.IMPLAUSIBLE_GBPS
    assert read.link("tf") == Link(1e-4, 2e-9)
    assert any("cached horovod link (1e+06 GB/s) was not a measurement" in n for n in read.noise)


def test_a_cached_implausible_link_without_samples_is_dropped(tmp_path):
    stale = network.Constants(Link(1e-4, 1e-9), {"horovod": Link(1e-4, 1e-15)}, 1e-10, 2, {},
                              {"horovod": [[16384, 3e-3]]})
    read = network.Constants.from_json(stale.to_json())
    assert "horovod" not in read.backends and read.link("horovod") == read.p2p


def test_fewer_cores_than_one_is_a_measurement_not_an_error():
    assert Cluster(processes=2, cores=0.997).cores == 0.997
    with pytest.raises(AdviseError, match="cores must be a positive number"):
        Cluster(processes=2, cores=0)


def test_a_negative_cluster_is_refused_not_read_as_a_host(capsys):
    with pytest.raises(SystemExit):
        parse_args(["keras_examples/deep_mlp.py:build_model", "--cluster", "-1", "--dry-run"])
    err = capsys.readouterr().err
    assert "processes must be a positive int" in err and "processes=-1" in err


def test_a_dry_run_of_a_function_that_does_not_exist_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["keras_examples/deep_mlp.py:no_such_fn", "--dry-run"])
    err = capsys.readouterr().err
    assert "defines no 'no_such_fn' at module level" in err
    assert "build_model" in err  # the names it does define
    with pytest.raises(SystemExit):
        main(["tfdist.no_such_module:build", "--dry-run"])
    assert "The target's module 'tfdist.no_such_module' cannot be found" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["tfdist.advise.cli:no_such_fn", "--dry-run"])
    assert "defines no 'no_such_fn'" in capsys.readouterr().err


def test_a_dry_run_of_a_real_function_still_runs(capsys):
    assert main(["keras_examples/deep_mlp.py:build_model", "--cluster", "2", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["target"] == "keras_examples/deep_mlp.py:build_model"
