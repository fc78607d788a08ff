"""In-graph collectives and the load a run meets: the chain probe's fit, the constants that carry
it (old files still read), the tensor term priced with it, and compute scaled by the speed now."""

from __future__ import annotations

import doctest
import importlib
import json

import pytest

from tfdist.advise import advisor, network
from tfdist.advise.candidates import Candidate, Cluster
from tfdist.advise.model import Link
from tfdist.advise.predict import IN_GRAPH, predict
from tfdist.errors import AdviseError
from tfdist.probe.ingraph import chain_slopes

pytestmark = pytest.mark.unit

PER_CALL = Link(alpha=2e-3, beta=3e-9, gamma=0.0)    # the probe's: dispatch and wait included
IN_GRAPH_LINK = Link(alpha=0.8e-3, beta=1.6e-9, gamma=0.0)


def _ranks(per_collective: dict[int, float], overhead: float, counts=(1, 4, 12)):
    """Two ranks' chain timings: ``overhead + N * per_collective``, rank 1 a little slower."""
    def times(size: int, n: int, extra: float) -> list[float]:
        base = overhead + n * per_collective[size] + extra
        return [base, base * 1.01, base * 0.99]

    return {f"worker:{r}": {"seconds": {str(s): {str(n): times(s, n, r * 1e-5) for n in counts}
                                        for s in per_collective}} for r in (0, 1)}


def test_chain_slopes_leave_the_call_overhead_out():
    truth = {4096: 1.6e-3, 262144: 2.5e-3}
    slopes = dict(chain_slopes(_ranks(truth, overhead=3e-3)))
    assert slopes == {4096: pytest.approx(1.6e-3, rel=0.02),
                      262144: pytest.approx(2.5e-3, rel=0.02)}


def test_fit_in_graph_recovers_alpha_and_beta_of_a_two_process_ring():
    sizes = [4096, 65536, 262144, 1 << 20]
    seconds = [2 * IN_GRAPH_LINK.alpha + n * IN_GRAPH_LINK.beta for n in sizes]
    got = network.fit_in_graph(list(zip(sizes, seconds, strict=True)), p=2, gamma=0.0)
    assert got.alpha == pytest.approx(IN_GRAPH_LINK.alpha)
    assert got.beta == pytest.approx(IN_GRAPH_LINK.beta)


def test_constants_carry_the_in_graph_link_and_older_files_still_read(tmp_path):
    new = network.Constants(PER_CALL, {"tf": PER_CALL}, 0.0, 2, {}, {}, {"tf": IN_GRAPH_LINK})
    assert network.load(network.save(new, tmp_path / "new.json")).in_graph_link() == IN_GRAPH_LINK
    old = new.to_json()
    del old["in_graph"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    read = network.load(tmp_path / "old.json")
    assert read.in_graph_link("tf") is None and read.link("tf") == PER_CALL
    assert advisor.links_of(read) == {"tf": PER_CALL}
    assert advisor.links_of(new) == {"tf": PER_CALL, IN_GRAPH: IN_GRAPH_LINK}


def test_a_cache_from_before_the_in_graph_probe_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDIST_CACHE", str(tmp_path))
    old = network.Constants(PER_CALL, {"tf": PER_CALL}, 0.0, 2, {}, {})
    network.save(old, network.default_path())
    fresh = network.Constants(PER_CALL, {"tf": PER_CALL}, 0.0, 2, {}, {}, {"tf": IN_GRAPH_LINK})
    monkeypatch.setattr(network, "probe", lambda **_: fresh)
    assert advisor.get_constants(Cluster(2), None) == fresh
    assert network.load(network.default_path()).in_graph_link() == IN_GRAPH_LINK
    assert advisor.get_constants(Cluster(2), None) == fresh  # now the cache serves


def _lm_profile():
    from tfdist.advise.profile import Line, ModelProfile

    hidden = 32 * 64 * 4
    return ModelProfile(
        names=("emb", "att", "out"), params=(1, 1, 1), param_bytes=(4000, 4000, 4000),
        activation_bytes=(hidden, hidden, 1024), forward=(Line(0, 1e-5),) * 3,
        backward=(Line(0, 2e-5),) * 3, step=Line(0, 9e-5), optimizer_slots=2, embeddings=(),
        threads=1, batch=32, split_bytes=(4000, 4000, 4000),
        reductions=((0, hidden), *((1, hidden),) * 4, (2, 128)), heads=4)


def test_the_tensor_term_is_priced_in_graph_and_says_which_link():
    prof, tensor = _lm_profile(), Candidate("tensor", 2, tensor=2)
    ring = lambda link, n: 2 * link.alpha + 32 * n * link.beta  # noqa: E731
    both = predict(tensor, prof, {"tf": PER_CALL, IN_GRAPH: IN_GRAPH_LINK}, Cluster(2, cores=2),
                   32)
    term = next(t for t in both.terms if t.kind == "tensor")
    assert term.seconds == pytest.approx(sum(ring(IN_GRAPH_LINK, n) for _, n in prof.reductions))
    assert "alpha 0.80 ms, in-graph" in term.detail
    old = predict(tensor, prof, {"tf": PER_CALL}, Cluster(2, cores=2), 32)
    term = next(t for t in old.terms if t.kind == "tensor")
    assert term.seconds == pytest.approx(sum(ring(PER_CALL, n) for _, n in prof.reductions))
    assert "per call (constants without the in-graph probe)" in term.detail


@pytest.mark.parametrize("candidate", [Candidate("default", 1), Candidate("multi_worker", 2),
                                       Candidate("tensor", 2, tensor=2),
                                       Candidate("pipeline", 2, stages=2, micro_batches=4)])
def test_compute_is_divided_by_the_speed_now_against_the_profiles(candidate):
    prof, links = _lm_profile(), {"tf": Link(0.0, 1e-15), IN_GRAPH: Link(0.0, 1e-15)}
    at_profile = predict(candidate, prof, links, Cluster(2, cores=2), 32)
    slower = predict(candidate, prof, links, Cluster(2, cores=2, speed=0.5), 32)
    for base, half in zip(at_profile.terms, slower.terms, strict=True):
        if base.kind in ("compute", "bubble"):
            assert half.seconds == pytest.approx(2 * base.seconds)
    compute = next(t for t in slower.terms if t.kind == "compute")
    if candidate.stages == 1 and candidate.tensor == 1:
        assert "speed 0.50 of the profile's" in compute.detail


@pytest.mark.parametrize("speed", [0, -1.0, True, "1"])
def test_a_speed_that_is_not_a_positive_number_is_refused(speed):
    with pytest.raises(AdviseError, match="Cluster speed must be a positive number"):
        Cluster(2, speed=speed)


def test_the_in_graph_probe_and_run_queue_examples_run():
    for name in ("tfdist.probe.ingraph", "tfdist.probe.common"):
        result = doctest.testmod(importlib.import_module(name))
        assert result.failed == 0 and result.attempted > 0


def test_fits_loop_is_paid_whole_by_every_process_of_a_split_layout():
    import dataclasses

    from tfdist.advise.profile import Line

    # Layers: 3 x 3e-5 s per sample (all split); the step adds fit's 2 ms loop and nothing else.
    prof = dataclasses.replace(_lm_profile(), step=Line(2e-3, 9e-5), loop_s=2e-3)
    links = {"tf": Link(0.0, 1e-15), IN_GRAPH: Link(0.0, 1e-15)}
    tensor = predict(Candidate("tensor", 2, tensor=2), prof, links, Cluster(2, cores=2), 32)
    compute = next(t for t in tensor.terms if t.kind == "compute")
    assert compute.seconds == pytest.approx(9e-5 * 32 / 2 + 2e-3)   # not (...+ 2e-3) / 2
    unmeasured = dataclasses.replace(prof, loop_s=0.0)                # the old rule: shared
    tensor = predict(Candidate("tensor", 2, tensor=2), unmeasured, links, Cluster(2, cores=2), 32)
    assert tensor.terms[0].seconds == pytest.approx((9e-5 * 32 + 2e-3) / 2)
