"""The advisor: cost formulas on hand-computed numbers, ranking and its reasons, bad input."""

from __future__ import annotations

import doctest
import importlib
import itertools
import json
import random
import time

import pytest

from tfdist.advise import cli, model, network
from tfdist.advise.advisor import advise, build, get_constants
from tfdist.advise.candidates import Candidate, Cluster, as_cluster, candidates
from tfdist.advise.model import Link
from tfdist.advise.predict import predict
from tfdist.advise.profile import EmbeddingUse, Line, ModelProfile, fit_line
from tfdist.errors import AdviseError, StrategyConfigError
from tfdist.pipeline import partition

pytestmark = pytest.mark.unit

LINK = Link(alpha=1e-4, beta=1e-9, gamma=2e-10)


def test_ring_and_halving_doubling_by_hand():
    # p=4, n=8 MB: 6 a + 2*3/4 n b + 3/4 n g = 0.6 ms + 12 ms + 1.2 ms
    assert model.ring_allreduce_s(4, 8e6, LINK) == pytest.approx(0.0138)
    # p=8: 2 lg 8 = 6 latency steps instead of 14
    assert model.halving_doubling_s(8, 8e6, LINK) == pytest.approx(6e-4 + 14e-3 + 1.4e-3)
    assert model.ring_allreduce_s(8, 8e6, LINK) == pytest.approx(14e-4 + 14e-3 + 1.4e-3)
    assert model.ring_allreduce_s(1, 8e6, LINK) == 0.0


def test_ps_traffic_is_the_slower_of_worker_and_ps_links():
    link = Link(alpha=1e-3, beta=1e-9)
    # 4 workers, 1 ps: the ps carries 4 MB each way: 2 * (1 a + 4e6 b)
    assert model.ps_traffic_s(1e6, 4, 1, link) == pytest.approx(2 * (1e-3 + 4e-3))
    # 8 shards: each ps carries 0.5 MB, the worker 1 MB: 2 * (8 a + 1e6 b)
    assert model.ps_traffic_s(1e6, 4, 8, link) == pytest.approx(2 * (8e-3 + 1e-3))


def test_pipeline_step_and_bubble():
    assert model.bubble(4, 4) == pytest.approx(3 / 7)
    # Transfers (2 x 3 ms) hide behind a 100 ms stage; behind a 1 ms stage, 5 ms show.
    assert model.pipeline_step_s(0.1, 4, 4, 2e6, Link(alpha=1e-3, beta=1e-9)) == (
        pytest.approx(0.7), 0.0)
    step, exposed = model.pipeline_step_s(0.001, 4, 4, 2e6, Link(alpha=1e-3, beta=1e-9))
    assert exposed == pytest.approx(7 * (6e-3 - 1e-3)) and step == pytest.approx(7 * 6e-3)
    assert model.pipeline_memory(1e6, 2, 1e5, 4) == pytest.approx(4.4e6)


def test_fit_ring_recovers_the_constants_it_was_made_from():
    sizes = [16e3, 256e3, 1e6, 4e6]
    times = [model.ring_allreduce_s(2, n, LINK) for n in sizes]
    got = network.fit_ring(sizes, times, p=2, gamma=LINK.gamma)
    assert got.alpha == pytest.approx(LINK.alpha, rel=1e-6)
    assert got.beta == pytest.approx(LINK.beta, rel=1e-6)
    assert fit_line([1, 2, 3], [3, 5, 7]) == Line(pytest.approx(1.0), pytest.approx(2.0))


def _profile(param_bytes=48_000_000, step=None, embeddings=()):
    step = step or Line(0.002, 1e-4)
    return ModelProfile(
        names=("a", "b", "c", "d"), params=(1, 1, 1, 1),
        param_bytes=(param_bytes // 4,) * 4, activation_bytes=(4000, 4000, 4000, 400),
        forward=(Line(0, 1e-5), Line(0, 3e-5), Line(0, 1e-5), Line(0, 1e-5)),
        backward=(Line(0, 2e-5), Line(0, 6e-5), Line(0, 2e-5), Line(0, 2e-5)),
        step=step, optimizer_slots=2, embeddings=embeddings, threads=1, batch=64)


def test_why_names_the_dominating_term_with_its_numbers():
    link = Link(alpha=1e-4, beta=1 / 2.1e9, gamma=0.0)
    pred = predict(Candidate("multi_worker", 2), _profile(), {"tf": link}, Cluster(2, cores=2), 64)
    comm = 2e-4 + 48e6 / 2.1e9                      # 2 a + n b at p=2
    compute = 0.002 + 32 * 1e-4
    assert pred.step_s == pytest.approx(comm + compute)
    assert pred.why() == (f"communication {100 * comm / (comm + compute):.0f}%: dense gradients "
                          "of 48.00 MB over 2.10 GB/s (tf all-reduce, alpha 0.10 ms)")
    # Halve the processes' cores: compute runs twice as long, the table says so.
    slow = predict(Candidate("multi_worker", 2), _profile(), {"tf": link}, Cluster(2, cores=1), 64)
    assert slow.terms[0].seconds == pytest.approx(2 * compute)
    assert "2 processes on 1 cores (x2.0)" in slow.terms[0].detail


def test_ps_counts_only_the_embedding_rows_a_batch_touches():
    emb = (EmbeddingUse("e", rows=1_000_000, row_bytes=64, unique_per_sample=0.5, measured_on=64),)
    prof = _profile(param_bytes=64_000_000 + 4_000_000, embeddings=emb)
    link = Link(alpha=0.0, beta=1e-9)
    pred = predict(Candidate("parameter_server", 2, ps=2), prof, {"tf": link}, Cluster(2), 64)
    touched = 0.5 * 32 * 64                          # 32 samples per worker
    assert pred.terms[1].seconds == pytest.approx(2 * (4e6 + touched) * 1e-9)
    assert "1.00 MB" not in pred.why()


def test_pipeline_prediction_uses_the_balanced_split_of_measured_costs():
    prof = _profile(param_bytes=4000, step=Line(0.0, 1.8e-4))   # the layers' sum: no rest
    link = Link(alpha=0.0, beta=0.0)
    pred = predict(Candidate("pipeline", 2, stages=2, micro_batches=4), prof, {"tf": link},
                   Cluster(2, cores=2), 64)
    micro_costs = [3e-5 * 16, 9e-5 * 16, 3e-5 * 16, 3e-5 * 16]   # balanced: [a, b] | [c, d]
    slowest = micro_costs[0] + micro_costs[1]
    assert pred.terms[0].seconds == pytest.approx(4 * slowest)   # the layers account for all
    assert pred.terms[1].seconds == pytest.approx(slowest)       # (K-1) idle slots
    # A whole step faster than its layers timed alone: they give its shares, scaled to it.
    fast = _profile(param_bytes=4000, step=Line(0.0, 0.9e-4))
    pred = predict(Candidate("pipeline", 2, stages=2, micro_batches=4), fast, {"tf": link},
                   Cluster(2, cores=2), 64)
    assert pred.terms[0].seconds == pytest.approx(4 * slowest / 2)
    assert pred.terms[1].seconds == pytest.approx(slowest / 2)


def test_a_stage_with_one_inter_op_thread_sends_after_its_compute_not_beside_it():
    import dataclasses

    prof = _profile(param_bytes=4000, step=Line(0.0, 1.8e-4))
    link = Link(alpha=1e-4, beta=1e-9)
    pipe = Candidate("pipeline", 2, stages=2, micro_batches=4)
    beside = predict(pipe, prof, {"tf": link}, Cluster(2, cores=2), 64)
    after = predict(pipe, dataclasses.replace(prof, inter_op_threads=1), {"tf": link},
                    Cluster(2, cores=2), 64)
    transfer = 2 * (1e-4 + 4000 * 16 * 1e-9)     # an activation there, its gradient back
    assert transfer < 4 * 3e-5 * 16              # shorter than a stage's compute: hidden
    assert after.step_s - beside.step_s == pytest.approx(5 * transfer)   # M + K - 1 slots


def test_memory_limit_reorders_and_then_refuses():
    prof = _profile()
    links = {"tf": LINK, "horovod": LINK}
    net = network.Constants(LINK, links, 2e-10, 2, {}, {})
    # Whole-model replicas need 48 MB x 4 (weights, grads, 2 Adam slots); a stage half that.
    fits_halves = advise(None, Cluster(2, device_memory=150e6), batch=64, constants=net,
                         profile=prof)
    assert fits_halves.best.candidate.stages == 2 or fits_halves.best.candidate.ps
    assert not fits_halves.prediction("default x1").fits
    with pytest.raises(AdviseError) as info:
        advise(None, Cluster(2, device_memory=1e6), batch=64, constants=net, profile=prof)
    message = str(info.value)
    assert "The model fits no layout of this cluster." in message
    assert "device_memory=1e+06 bytes, 2 processes" in message and "Fix: add processes" in message


def test_a_model_that_does_not_build_is_reported_with_its_error():
    def broken():
        raise ValueError("Input 0 of layer dense is incompatible")

    with pytest.raises(AdviseError) as info:
        build(broken)
    assert "The model could not be built: ValueError: Input 0 of layer dense" in str(info.value)
    assert "Received: broken" in str(info.value)
    with pytest.raises(AdviseError, match="neither a Keras model nor a function"):
        build(42)


def test_cluster_inputs_and_their_errors():
    assert as_cluster("localhost:2,otherhost:2").processes == 4
    assert as_cluster(3).processes == 3
    with pytest.raises(AdviseError, match=r"Received: 2.5\. Expected: a process count"):
        as_cluster(2.5)
    with pytest.raises(AdviseError, match="processes must be a positive int"):
        Cluster(processes=0)


def test_a_remote_host_cannot_be_probed_from_here():
    with pytest.raises(AdviseError) as info:
        get_constants(as_cluster("node7:2,node8:2"), None)
    message = str(info.value)
    assert "Cannot probe the network of hosts ['node7', 'node8'] from here" in message
    assert "tfdist-advise --probe-only --constants net.json" in message


def test_constants_round_trip_and_a_bad_file(tmp_path):
    net = network.Constants(LINK, {"tf": LINK}, 2e-10, 2, {"cores": 2}, {"tf": [[1, 2.0]]})
    assert network.load(network.save(net, tmp_path / "n.json")) == net
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(AdviseError, match=r"Cannot read network constants from .*bad\.json"):
        network.load(tmp_path / "bad.json")


def _brute_force(costs, stages):
    return min(max(partition.stage_costs(costs, (0, *cuts, len(costs))))
               for cuts in itertools.combinations(range(1, len(costs)), stages - 1))


@pytest.mark.parametrize("seed", range(20))
def test_balanced_split_of_measured_costs_is_optimal(seed):
    rng = random.Random(seed)
    costs = [rng.uniform(1e-4, 5e-3) for _ in range(rng.randint(2, 9))]
    stages = rng.randint(1, min(4, len(costs)))
    bounds = partition.balanced_bounds(costs, stages)
    assert max(partition.stage_costs(costs, bounds)) == pytest.approx(_brute_force(costs, stages))


def test_layer_costs_are_checked():
    with pytest.raises(StrategyConfigError) as info:
        partition.check_layer_costs([1.0, float("nan")], ["a", "b"])
    assert "layer_costs must give one finite, non-negative cost per layer" in str(info.value)
    with pytest.raises(StrategyConfigError, match=r"2 numbers .* in layer order \['a', 'b'\]"):
        partition.check_layer_costs([1.0], ["a", "b"])


def test_candidates_and_command_lines():
    labels = [c.label for c in candidates(Cluster(4), batch=64, micro_batches=(4,))]
    assert labels == ["default x1", "multi_worker x4", "horovod x4", "multi_worker x4 zero=1",
                      "multi_worker x4 zero=2", "multi_worker x4 zero=3",
                      "parameter_server x4 +1ps", "parameter_server x4 +2ps",
                      "pipeline D=2 x K=2 M=4", "pipeline K=4 M=4"]
    assert Candidate("parameter_server", 2, ps=1).launch_argv("t.py") == [
        "tfdist-launch", "--strategy", "parameter_server", "--workers", "2", "--ps", "1", "t.py"]


_MLP = "keras_examples/deep_mlp.py:build_model"


def test_cli_dry_run_measures_nothing(capsys):
    assert cli.main(["keras_examples/deep_mlp.py:build_model", "--cluster", "localhost:2",
                     "--batch", "32", "--dry-run",
                     "--micro-batches", "4", "--max-ps", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cluster"]["processes"] == 2 and out["batch"] == 32
    assert out["candidates"] == ["default x1", "multi_worker x2", "horovod x2",
                                 "multi_worker x2 zero=1", "multi_worker x2 zero=2",
                                 "multi_worker x2 zero=3", "parameter_server x2 +1ps",
                                 "pipeline K=2 M=4"]


@pytest.mark.parametrize("flags, says", [
    (["missing_script.py:build", "--dry-run"], "The target's script 'missing_script.py' does not"),
    (["missing_script.py:build"], "The target's script 'missing_script.py' does not exist"),
    (["keras_examples/deep_mlp.py"], "The target names no build function"),
    ([_MLP, "--micro-batches", "0"], "--micro-batches must list"),
    ([_MLP, "--micro-batches", "4,x"], "--micro-batches must list"),
    ([_MLP, "--max-ps", "-1"], "Received: --max-ps -1. Expected: an int >= 0"),
    ([_MLP, "--backends", "bogus"], "Received: --backends bogus"),
    ([_MLP, "--cluster", "100000"], "cannot give each of 100000 training processes a sample"),
    ([_MLP, "--json", "README.md/advice.json"], "--json cannot be written"),
])
def test_cli_refuses_bad_flags_before_measuring_anything(flags, says, capsys, monkeypatch):
    def no_probe(*args, **kwargs):
        raise AssertionError("the network was probed before the flags were checked")

    monkeypatch.setattr(network, "probe", no_probe)
    monkeypatch.setattr(cli, "get_constants", no_probe)
    started = time.perf_counter()
    with pytest.raises(SystemExit) as exited:
        cli.main(flags)
    assert exited.value.code == 2 and time.perf_counter() - started < 1.0
    assert says in capsys.readouterr().err


def test_cli_reports_a_missing_build_function(capsys, tmp_path):
    net = network.save(network.Constants(LINK, {"tf": LINK}, 0.0, 2, {}, {}), tmp_path / "n.json")
    with pytest.raises(SystemExit) as exited:  # refused when parsed: nothing is measured
        cli.main(["no_such_module_x:build", "--constants", str(net)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "The target's module 'no_such_module_x' cannot be found" in err


@pytest.mark.parametrize("name", ["tfdist.advise", "tfdist.advise.model",
                                  "tfdist.advise.candidates", "tfdist.advise.predict",
                                  "tfdist.advise.network", "tfdist.advise.report",
                                  "tfdist.advise.cli", "tfdist.advise.profile",
                                  "tfdist.advise.advisor", "tfdist.advise.cores",
                                  "tfdist.advise.curve"])
def test_docstring_examples_run(name, monkeypatch):
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    result = doctest.testmod(importlib.import_module(name))
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.slow  # seconds of training, a TF process or waiting: make test, not test-fast
def test_profile_finds_the_heavy_layer_and_the_split_isolates_it():
    from tfdist.advise.profile import profile_model
    from tfdist.core import flavour
    from tfdist.pipeline import stage

    keras = flavour.get_keras()

    def chain():
        return keras.Sequential([keras.Input((64,)), keras.layers.Dense(8, name="thin_0"),
                                 keras.layers.Dense(8, name="thin_1"),
                                 keras.layers.Dense(8, name="thin_2"),
                                 keras.layers.Dense(1024, name="wide"),
                                 keras.layers.Dense(1024, name="wider"),
                                 keras.layers.Dense(8, name="thin_3")])

    prof = profile_model(chain(), batch=256, repeats=5)
    costs = dict(zip(prof.names, prof.layer_costs(256), strict=True))
    assert costs["wider"] > 5 * max(costs["thin_0"], costs["thin_1"], costs["thin_2"]), costs
    assert prof.params == (520, 72, 72, 9216, 1049600, 8200)
    assert prof.activation_bytes == (32, 32, 32, 4096, 4096, 32)
    # By parameter count "wider" alone is half the model; by measured time too, so both
    # splits cut before it. The costs of layers in the reverse order move the cut.
    _, by_time = stage.split_model(chain, stages=2, layer_costs=prof.layer_costs(256))
    assert by_time[1] in (4, 5)
    _, reversed_costs = stage.split_model(chain, stages=2, layer_costs=[10, 0, 0, 0, 0, 0])
    assert reversed_costs == (0, 1, 6)


def test_tfdist_advise_is_the_package_and_the_function():
    import tfdist

    prof = _profile(param_bytes=4000)
    net = network.Constants(LINK, {"tf": LINK}, 0.0, 2, {}, {})
    advice = tfdist.advise(None, 2, batch=64, constants=net, profile=prof)
    assert advice.best.candidate.label == tfdist.advise.advise(
        None, 2, batch=64, constants=net, profile=prof).best.candidate.label
    assert "advise" in tfdist.__all__ and "AdviseError" in tfdist.__all__
