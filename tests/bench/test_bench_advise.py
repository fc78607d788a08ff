"""The advise benchmark's arithmetic: per-global-batch times, median error, first-choice verdict."""

from __future__ import annotations

import numpy as np
import pytest

from tfdist.advise import Candidate
from tfdist.bench import advise

pytestmark = pytest.mark.unit

EX = advise.Example("ctr", 256, "parameter_server")


def test_async_workers_share_fit_steps_so_a_global_batch_takes_batch_over_worker_batch_steps():
    report = {"chief:0": {"step_s": 0.01, "samples_per_step": 128}}
    assert advise._measured_step(Candidate("parameter_server", 2, ps=1), EX, report) == 0.02
    sync = {"worker:0": {"step_s": 0.01, "samples_per_step": 128}}
    assert advise._measured_step(Candidate("multi_worker", 2), EX, sync) == 0.01


def _row(example, candidate, rank, predicted, measured):
    return {"example": example, "candidate": candidate, "predicted_rank": rank,
            "predicted_ms": predicted, "measured_ms": measured,
            "error": predicted / measured - 1}


def test_summary_median_error_and_first_choice_within_ten_percent():
    rows = [_row("a", "x", 1, 10, 10.5), _row("a", "y", 2, 12, 10.0),    # 1st 5% slower: ok
            _row("b", "x", 1, 10, 20.0), _row("b", "y", 2, 11, 10.0)]    # 1st 2x slower: missed
    summary = advise.summarize(rows)
    assert summary["median_abs_error"] == pytest.approx(0.15)   # |errors| .05 .1 .2 .5
    verdict = summary["first_choice"]
    assert verdict["a"]["ok"] and verdict["a"]["first_over_fastest"] == pytest.approx(1.05)
    assert not verdict["b"]["ok"] and verdict["b"]["fastest"] == "y"
    assert [r["measured_rank"] for r in rows] == [2, 1, 2, 1]
    assert "b: first choice x, measured fastest y (MISSED, 2.00x)" in advise.note(summary)


LM = next(e for e in advise.AdviseBenchConfig().examples if e.name == "lm")


def test_the_examples_include_the_transformer_lm_under_keras3_with_its_tensor_layout():
    config = advise.AdviseBenchConfig(quick=True, env={"EXTRA": "1"})
    assert [e.name for e in config.examples] == ["image", "ctr", "deep", "lm"]
    assert LM.headline == "tensor" and LM.batch == 32
    assert config.child_env(LM) == {"TFDIST_BENCH_THREADS": "1,1", "TF_USE_LEGACY_KERAS": "0",
                                    "EXTRA": "1"}
    assert "TF_USE_LEGACY_KERAS" not in config.child_env(config.examples[0])  # tf-keras: jobs'


def test_a_tensor_job_gets_the_mesh_and_t_as_tfdist_launch_gives_them(monkeypatch, tmp_path):
    from tfdist.parallel.mesh import MESH_ENV, Mesh

    seen = {}
    monkeypatch.setattr(advise.jobs, "run_tf", lambda spec, script, args, **kw: seen.update(
        spec=spec, script=script, args=args, **kw) or {})
    with open(tmp_path / "log", "w") as log:
        advise._tf(Candidate("tensor", 2, tensor=2), LM, advise.AdviseBenchConfig(), log)
    env = seen["env"]
    assert env["TFDIST_STRATEGY"] == "tensor" and "TFDIST_TENSOR_SHARDS" not in env  # T: mesh
    assert env[MESH_ENV] == Mesh(1, 1, 2).to_env() and env["TF_USE_LEGACY_KERAS"] == "0"
    assert seen["spec"].num_workers == 2 and not seen["spec"].ps and not seen["spec"].chief
    args = seen["args"]
    assert args[args.index("--example") + 1] == "lm"
    assert args[args.index("--batch") + 1] == "32"  # every shard reads the global batch


def test_the_advisor_offers_a_tensor_layout_for_the_lm_and_prices_all_its_all_reduces():
    import sys

    from tfdist.advise import Cluster, network
    from tfdist.advise.advisor import advise as ask
    from tfdist.advise.model import Link
    from tfdist.advise.profile import Line, ModelProfile, tensor_parts
    from tfdist.bench.workers import advise_worker
    from tfdist.core import flavour

    keras = flavour.get_keras()
    sys.path.insert(0, str(advise_worker._EXAMPLES_DIR))
    import transformer_lm

    sizes = advise_worker.LM_SIZES
    lm = transformer_lm.build_model(keras, **sizes)
    layers = [layer for layer in lm.layers if type(layer).__name__ != "InputLayer"]
    acts = [int(np.prod(layer.output.shape[1:])) * 4 for layer in layers]
    split, reductions, heads = tensor_parts(layers, acts)
    hidden = sizes["seq"] * sizes["width"] * 4
    # 4 per block, the embedding's sum, the logits' input gradient and the loss's three sums.
    assert heads == sizes["heads"] and len(reductions) == 4 * sizes["blocks"] + 1 + 1 + 3
    assert sorted({n for _, n in reductions}) == [sizes["seq"] * 4, hidden]
    assert split[[x.name for x in layers].index("block0_attention_norm")] == 0
    n = len(layers)
    prof = ModelProfile(names=tuple(x.name for x in layers), params=(1,) * n,
                        param_bytes=(4,) * n, activation_bytes=tuple(acts),
                        forward=(Line(0, 1e-5),) * n, backward=(Line(0, 2e-5),) * n,
                        step=Line(0, 3e-5 * n), optimizer_slots=2, embeddings=(), threads=1,
                        batch=32, split_bytes=split, reductions=reductions, heads=heads)
    link = Link(alpha=1e-4, beta=1e-9, gamma=0.0)
    net = network.Constants(link, {"tf": link}, 0.0, 2, {}, {})
    advice = ask(None, Cluster(2, cores=2), batch=32, constants=net, profile=prof,
                 backends=("tf",), micro_batches=(4,), max_ps=1)
    [tensor] = [p for p in advice.predictions if p.candidate.label == "tensor T=2"]
    terms = {t.kind: t.seconds for t in tensor.terms}
    assert terms["tensor"] == pytest.approx(sum(2 * link.alpha + 32 * b * link.beta
                                                for _, b in reductions))
    whole = sum(prof.layer_costs(32))
    replicated = sum(c for c, s in zip(prof.layer_costs(32), split, strict=True) if not s)
    assert terms["compute"] == pytest.approx((whole + replicated) / 2)  # replicated: not halved


def _run_image(monkeypatch, tmp_path, runner, references, quick=False, budget=None):
    from tfdist.advise import network
    from tfdist.advise.model import Link
    from tfdist.advise.profile import Line, ModelProfile

    prof = ModelProfile(names=("d",), params=(1,), param_bytes=(4,), activation_bytes=(4,),
                        forward=(Line(0, 1e-5),), backward=(Line(0, 2e-5),),
                        step=Line(0, 1e-4), optimizer_slots=0, embeddings=(), threads=1,
                        batch=64)
    link = Link(alpha=0.0, beta=1e-15)
    net = network.Constants(link, {"tf": link, "horovod": link}, 0.0, 2, {}, {})
    cores = iter([2.0, 1.0] * 10)
    steps = iter(references)
    monkeypatch.setattr(advise, "_profile",
                        lambda *a: advise.Profiled(prof, next(steps)))
    monkeypatch.setattr(advise, "_reference", lambda *a: next(steps))
    monkeypatch.setattr(advise, "usable_cores", lambda n: next(cores))
    monkeypatch.setattr(advise.os, "getloadavg", lambda: (3.0, 0, 0))
    monkeypatch.setattr(advise, "_measured_step", lambda c, ex, result: 0.02)
    monkeypatch.setattr(advise, "RUNNERS", {k: runner for k in advise.RUNNERS})
    monkeypatch.setattr(advise, "measure_overheads", lambda wanted, ex, net, *a: net)
    config = advise.AdviseBenchConfig(top=2, only=("image",))
    config.quick = quick
    [image] = config.examples
    with open(tmp_path / "log", "w") as log:
        rows, _, _ = advise.run_example(image, net, config, log, budget)
    return rows


AT_PROFILE_MS = 32 * 1e-4 * 1e3   # multi_worker x2: 32 samples a replica, on 2 free cores


def test_each_row_is_predicted_again_under_the_load_its_run_met(monkeypatch, tmp_path):
    waited = {"worker:0": {"run_queue": {"cpu_s": 1.0, "wait_s": 1.0}},     # 2 s per CPU s
              "worker:1": {"run_queue": {"cpu_s": 2.0, "wait_s": 1.0}}}     # 1.5
    # Reference steps: 10 ms after the profile (then 2.0 cores), 30 ms after the first run,
    # 20 ms after the second; the profile's whole step of the global batch: 6.4 ms.
    first, second = _run_image(monkeypatch, tmp_path, lambda *a: waited, [0.01, 0.03, 0.02])
    assert first["candidate"] == "multi_worker x2"
    assert first["reference_ms"] == pytest.approx(20.0)   # (10 + 30) / 2
    assert first["speed"] == pytest.approx(6.4 / 20.0)
    assert (first["cores"], first["load"]) == (1.5, 3.0)   # the readings' means
    assert first["at_profile_ms"] == pytest.approx(AT_PROFILE_MS)
    # Now: 2 processes on 1.5 cores, each at 6.4 / 20 of the profile's speed.
    assert first["predicted_ms"] == pytest.approx(AT_PROFILE_MS * (2 / 1.5) / (6.4 / 20.0))
    assert first["error"] == pytest.approx(first["predicted_ms"] / 20.0 - 1)
    assert first["run_queue"] == pytest.approx(1.75)
    assert first["at_profile_error"] == pytest.approx(AT_PROFILE_MS / 20.0 - 1)
    summary = advise.summarize([first, second])
    assert summary["median_abs_error_at_profile"] == pytest.approx(1 - AT_PROFILE_MS / 20.0)
    assert summary["median_abs_error_without_default"] == pytest.approx(
        abs(second["error"]) / 2 + abs(first["error"]) / 2)   # neither row is default x1
    assert "predicted at profile time" in advise.note(summary)
    assert second["reference_ms"] == pytest.approx(25.0)
    assert second["speed"] == pytest.approx(6.4 / 25.0)


def test_examples_can_be_picked_by_name():
    assert [e.name for e in advise.AdviseBenchConfig(only=("lm",)).examples] == ["lm"]
    from tfdist.bench import cli

    assert cli.configs(cli.parse_args(["advise", "--examples", "deep,lm"]))["advise"].only == (
        "deep", "lm")
    with pytest.raises(SystemExit):
        cli.parse_args(["advise", "--examples", "nope"])


def test_a_layouts_overhead_is_its_null_models_steps_less_the_formulas_and_joins_its_prediction(
        monkeypatch, tmp_path):
    from tfdist.advise import Cluster, network, predict
    from tfdist.advise.model import Link
    from tfdist.advise.profile import Line, ModelProfile

    def null(weights):
        return ModelProfile(names=("n",), params=(2,), param_bytes=(8,), activation_bytes=(8,),
                            forward=(Line(0, 1e-6),), backward=(Line(0, 1e-6),),
                            step=Line(1e-3, 0), optimizer_slots=0, embeddings=(), threads=1,
                            batch=8, weight_tensors=weights)

    nulls = {"null_4": null(8), "null_32": null(64)}
    steps = {"null_4": 0.006, "null_32": 0.013}   # the 56 more weights: 7 ms more
    link = Link(alpha=1e-4, beta=1e-10)
    net = network.Constants(link, {"tf": link, "horovod": link}, 0.0, 2, {}, {},
                            overheads={"tf_keras": {"horovod x2": (0.004, 0.0)}})
    ran = []
    monkeypatch.setattr(advise, "_profile",
                        lambda ex, *a, **kw: advise.Profiled(nulls[ex.name], 0.0))
    monkeypatch.setattr(advise, "usable_cores", lambda n: 2.0)
    def runner(c, ex, config, log, extra=()):
        ran.append((c.label, ex.name))
        idle = {"helper_cores": 0.25} if "--idle-seconds" in extra else {}  # the larger null's
        return {"worker:0": {"step_s": steps[ex.name], "samples_per_step": 4, **idle}}

    monkeypatch.setattr(advise, "RUNNERS", {k: runner for k in advise.RUNNERS})
    wanted = [Candidate("default", 1), Candidate("multi_worker", 2), Candidate("horovod", 2)]
    deep = next(e for e in advise.EXAMPLES if e.name == "deep")
    with open(tmp_path / "log", "w") as log:
        got = advise.measure_overheads(wanted, deep, net, advise.AdviseBenchConfig(), log)
    # one process: no overhead; horovod x2: known already; multi_worker x2: both nulls run
    assert ran == [("multi_worker x2", "null_4"), ("multi_worker x2", "null_32")]
    mw = Candidate("multi_worker", 2)
    formula = predict(mw, null(8), {"tf": link}, Cluster(2, cores=2.0), 8).step_s
    base, per_weight, helper = got.overheads_of("tf_keras")["multi_worker x2"]
    assert per_weight == pytest.approx(0.007 / 56)
    assert base == pytest.approx(0.006 - formula - 8 * 0.007 / 56)
    assert helper == 0.25
    assert got.overheads_of("tf_keras")["horovod x2"] == (0.004, 0.0)
    assert got.overheads_of("keras3") == {}
    assert advise.flavour_of(LM) == "keras3" and advise.flavour_of(deep) == "tf_keras"
    # a model of 20 weights under that layout carries base + 20 x per_weight as its own term
    model = null(20)
    plain = predict(mw, model, {"tf": link}, Cluster(2, cores=2.0), 8)
    priced = predict(mw, model, {"tf": link}, Cluster(2, cores=2.0), 8,
                     got.overheads_of("tf_keras"))
    # ... and its compute shares the 2 cores with the helper threads: 2 x 1.25 busy on 2
    crowded = predict(mw, model, {"tf": link}, Cluster(2, cores=2.0 / 1.25), 8)
    assert priced.step_s == pytest.approx(crowded.step_s + base + 20 * per_weight)
    assert crowded.terms[0].seconds == pytest.approx(plain.terms[0].seconds * 1.25)
    assert [t.kind for t in priced.terms][-1] == "overhead"
    assert "its helper threads take 0.25 cores a process" in priced.terms[-1].detail
    assert network.Constants.from_json(got.to_json()) == got   # kept in the constants file


def test_quick_is_short_and_bounded_by_a_time_budget():
    config = advise.AdviseBenchConfig(quick=True, steps=40, repeats=5)
    assert (config.steps, config.repeats, config.top) == (10, 2, 1)
    assert config.budget_s == advise.QUICK_BUDGET_S
    assert config.timeout == advise.QUICK_JOB_TIMEOUT_S
    assert advise.AdviseBenchConfig().budget_s is None  # a full run has none
    from tfdist.bench import cli

    given = cli.configs(cli.parse_args(["advise", "--quick", "--budget", "900"]))["advise"]
    assert given.budget_s == 900.0


def test_a_spent_budget_still_ends_with_a_row_and_says_what_it_skipped(monkeypatch, tmp_path):
    from tfdist.advise import network
    from tfdist.advise.model import Link

    link = Link(alpha=0.0, beta=1e-15)
    net = network.Constants(link, {"tf": link}, 0.0, 2, {}, {})
    monkeypatch.setattr(advise.network, "probe", lambda **kwargs: net)

    def one_row(ex, net, config, log, budget):  # the first candidate's run, as run_example's
        assert budget.allows(f"{ex.name}: default x1", first_row=True)
        budget.measured += 1
        assert not budget.allows(f"{ex.name}: horovod x2", first_row=True)
        row = {"example": ex.name, "candidate": "default x1", "predicted_rank": 1,
               "measured_ms": 5.0, "error": 0.1, "load": 7.5, "reference_ms": 4.0}
        return [row], {}, net

    monkeypatch.setattr(advise, "run_example", one_row)
    config = advise.AdviseBenchConfig(quick=True, budget_s=0.0, only=("image", "lm"))
    with open(tmp_path / "log", "w") as log:
        result = advise.run(config, log)
    assert [r["example"] for r in result["rows"]] == ["image"]
    assert result["skipped"] == ["image: horovod x2", "lm (all of it)"]
    assert "Time budget of 0 s spent: skipped image: horovod x2, lm (all of it)." in \
        result["note"]
    assert "load 7.5-7.5 during the runs" in result["note"]


def test_a_quick_run_notes_a_failed_job_and_goes_on(monkeypatch, tmp_path):
    from tfdist.errors import TaskFailedError

    calls = []

    def runner(c, *args):
        calls.append(c.label)
        if len(calls) == 1:
            raise TaskFailedError("worker:0", 1, "killed")
        return {}

    budget = advise.Budget(None)
    rows = _run_image(monkeypatch, tmp_path, runner, [0.01, 0.03, 0.02], quick=True,
                      budget=budget)
    assert len(calls) == 2 and [r["candidate"] for r in rows] == [calls[1]]
    assert budget.failed == [f"image: {calls[0]} (TaskFailedError)"]
    assert "Failed or timed out (a busy machine): image:" in budget.note()
