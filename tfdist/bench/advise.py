"""``advise``: the advisor's predictions against measured step times, for the four examples.

For each example (``image``: the dense CNN on digits; ``ctr``: the sparse CTR model; ``deep``:
the deep MLP made for pipelines; ``lm``: the Transformer LM made for tensor parallelism, under
Keras 3 as the ``tensor`` strategy needs) on ``np`` processes of this machine, one TF thread
each:

1. the network probe (`tfdist.advise.network.probe`), once;
2. the model's profile, in a child process with the jobs' Keras and threads, then a reference
   step (`_reference`: one process trains the example for a few steps, the ``default x1``
   job made short), then the cores ``np`` processes really get on this shared machine
   (`tfdist.advise.cores.usable_cores`);
3. the advisor's ranking; its top ``top`` candidates, plus the example's own layout when it is
   not among them (``ctr``: parameter servers, ``deep``: the pipeline, ``lm``: the tensor
   split ``T = np``), are run for real
   (`workers/advise_worker.py`), and each step is timed;
4. around each run, the load it meets is measured: the reference step again after it (the
   one before it being the previous run's after), and the cores before and after, each
   averaged; the candidate is predicted again under that load (`Cluster.speed`: the
   profile's whole step over the reference step around the run, the same quantity measured
   again; `Cluster.cores`). So the prediction compared is made for the machine the run had,
   not the one the profile had (a shared machine's load moves by 2-3x within minutes, and the
   profile's few-second step readings land in quiet or busy moments). The ``default x1``
   row is then nearly a measurement (its job is the reference, longer); the other rows test
   the model's splits, communication and contention. The advisor's prediction at profile
   time is kept beside it, and the median without the ``default x1`` rows.

Per row: predicted and measured seconds per global batch (for asynchronous parameter servers,
the time in which the workers together train one global batch), the error, the load (the
1-minute load average, the reference step, the speed and cores measured). Per example:
whether the advisor's first choice (ranked at profile time) is the measured fastest, or within
10% of it. Overall: the median absolute error (target <= 25%).

Example:
    >>> [e.name for e in AdviseBenchConfig(quick=True).examples]
    ['image', 'ctr', 'deep', 'lm']
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, Any

from tfdist.advise import Candidate, Cluster, ModelProfile, advise, network, predict
from tfdist.advise.advisor import links_of
from tfdist.advise.cores import usable_cores
from tfdist.advise.profile import fit_curve
from tfdist.bench.advise_budget import QUICK_BUDGET_S, QUICK_JOB_TIMEOUT_S, Budget, machine_noise
from tfdist.bench.workers import WORKERS
from tfdist.bench.workers.advise_worker import HELPER_CORES, RUN_QUEUE
from tfdist.cluster import ClusterSpec
from tfdist.core.flavour import LEGACY_KERAS_ENV
from tfdist.core.registry import strategy_traits
from tfdist.errors import LaunchError
from tfdist.launcher.mesh_plan import MESH_ENV, plan_mesh
from tfdist.launcher.options import JobOptions, StrategyOptions
from tfdist.probe import jobs
from tfdist.probe.common import THREADS_ENV

__all__ = ["Example", "EXAMPLES", "EXAMPLE_NAMES", "NULLS", "AdviseBenchConfig", "Budget", "run",
           "summarize", "measure_overheads", "overhead_line", "flavour_of", "machine_noise",
           "QUICK_BUDGET_S", "QUICK_JOB_TIMEOUT_S"]

KERAS3 = {LEGACY_KERAS_ENV: "0"}
"""The LM's jobs: the ``tensor`` strategy's split layers are Keras 3's (its traits), so every
layout of that example runs under Keras 3, the others under the benchmark's tf-keras."""

_MODULE = "tfdist.bench.workers.advise_worker"
_SCRIPT = WORKERS / "advise_worker.py"


@dataclasses.dataclass(frozen=True)
class Example:
    """An example model: its name in the worker, global batch, the layout it was made for, and
    the environment its jobs need beyond the benchmark's (``env``: Keras 3 for the LM)."""

    name: str
    batch: int
    headline: str
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)


NULLS = (Example("null_4", 8, "multi_worker"), Example("null_32", 8, "multi_worker"))
"""The null models (`advise_worker`: chains of 4 and 32 LayerNormalizations, 8 and 64
weights, 8 rows a step): their steps under a layout are what the layout costs whatever the
model, and per weight."""

EXAMPLES = (Example("image", 64, "multi_worker"), Example("ctr", 256, "parameter_server"),
            Example("deep", 256, "pipeline"), Example("lm", 32, "tensor", KERAS3))
EXAMPLE_NAMES = tuple(e.name for e in EXAMPLES)


@dataclasses.dataclass
class AdviseBenchConfig:
    """What to run. ``env`` goes to every child; ``only``: the examples to run (all: empty)."""

    np: int = 2
    quick: bool = False
    top: int = 3
    steps: int = 20
    repeats: int = 3
    constants: str | None = None
    examples: tuple[Example, ...] = EXAMPLES
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    timeout: float = 600.0
    only: tuple[str, ...] = ()
    budget_s: float | None = None

    def __post_init__(self) -> None:
        if self.quick:  # a smoke run: every path once, short jobs, a time budget (`Budget`)
            self.steps, self.repeats = min(self.steps, 10), min(self.repeats, 2)
            self.top, self.timeout = min(self.top, 1), min(self.timeout, QUICK_JOB_TIMEOUT_S)
            self.budget_s = QUICK_BUDGET_S if self.budget_s is None else self.budget_s
        if self.only:  # a subset, to iterate on one example
            self.examples = tuple(e for e in self.examples if e.name in self.only)

    def child_env(self, example: Example) -> dict[str, str]:
        """What a job of ``example`` gets: one TF thread each, its own variables, ``env``."""
        return {THREADS_ENV: "1,1", **example.env, **self.env}


def _args(example: Example, batch: int, config: AdviseBenchConfig, c: Candidate,
          extra: Sequence[str] = ()) -> list[str]:
    # Asynchronous workers: fit schedules steps ahead, so time whole fits instead of steps.
    timing = ["--timing", "difference", "--steps", str(3 * config.steps)] if c.ps else [
        "--steps", str(config.steps)]
    return ["--example", example.name, "--train", "--batch", str(batch), "--repeats",
            str(config.repeats), *timing, *extra]


def _local(c: Candidate, ex: Example, config: AdviseBenchConfig, log: IO[str],
           extra: Sequence[str] = ()) -> Any:
    return jobs.run_local(_MODULE, _args(ex, ex.batch, config, c, extra),
                          env=config.child_env(ex),
                          log=log, timeout=config.timeout)


def _tf(c: Candidate, ex: Example, config: AdviseBenchConfig, log: IO[str],
        extra: Sequence[str] = ()) -> Any:
    env = {**config.child_env(ex), "TFDIST_STRATEGY": c.strategy}
    batch = ex.batch // c.processes
    if c.stages > 1:
        env |= {"TFDIST_PIPELINE_STAGES": str(c.stages),
                "TFDIST_PIPELINE_MICRO_BATCHES": str(c.micro_batches)}
        batch = ex.batch
    if c.tensor > 1:  # as tfdist-launch gives it: T in the mesh, planned as the launcher does
        asked = StrategyOptions(stages=c.stages if c.stages > 1 else None, tensor=c.tensor)
        mesh = plan_mesh(JobOptions(str(_SCRIPT), strategy=c.strategy, workers=c.processes,
                                    strategy_options=asked), strategy_traits(c.strategy))
        env[MESH_ENV] = mesh.to_env()  # type: ignore[union-attr] - a tensor strategy's: a mesh
        batch = ex.batch  # every process reads the global batch, as in a pipeline
    spec = ClusterSpec.local(workers=c.processes, ps=c.ps, chief=bool(c.ps), host="127.0.0.1")
    return jobs.run_tf(spec, _SCRIPT, _args(ex, batch, config, c, extra), env=env, log=log,
                       timeout=config.timeout)


def _horovod(c: Candidate, ex: Example, config: AdviseBenchConfig, log: IO[str],
             extra: Sequence[str] = ()) -> Any:
    return jobs.run_horovod(c.processes, _MODULE,
                            _args(ex, ex.batch // c.processes, config, c, extra),
                            env=config.child_env(ex), log=log, timeout=config.timeout)


RUNNERS: Mapping[str, Callable[..., Any]] = {
    "default": _local, "multi_worker": _tf, "parameter_server": _tf, "pipeline": _tf,
    "horovod": _horovod, "tensor": _tf}
"""Strategy -> how the benchmark starts a job of it. Tensor layouts (``tensor``, D x T) are
offered for the example with attention heads (``lm``), since the ``tensor`` strategy takes
``--tensor``."""


def _measured_step(c: Candidate, ex: Example, result: Mapping[str, Any]) -> float:
    """Seconds per global batch: a worker step times the share of the batch it trains."""
    got = jobs.first_report(result)
    # Asynchronous workers share fit's steps: one step trains one worker's batch.
    return got["step_s"] * (ex.batch / got["samples_per_step"] if c.ps else 1.0)


def run_queue_slowdown(reports: Iterable[Mapping[str, Any]]) -> float | None:
    """Wall seconds per CPU second the reporting processes' work took, their mean: ``(cpu +
    wait) / cpu`` of each `RUN_QUEUE` reading (None: none reported one).

    Example:
        >>> run_queue_slowdown([{"run_queue": {"cpu_s": 2.0, "wait_s": 1.0}},
        ...                     {"run_queue": {"cpu_s": 1.0, "wait_s": 1.0}}, {"other": 1}])
        1.75
    """
    ratios = [(r[RUN_QUEUE]["cpu_s"] + r[RUN_QUEUE]["wait_s"]) / r[RUN_QUEUE]["cpu_s"]
              for r in reports if isinstance(r, Mapping) and r.get(RUN_QUEUE, {}).get("cpu_s")]
    return statistics.mean(ratios) if ratios else None


@dataclasses.dataclass(frozen=True)
class Profiled:
    """An example's profile, and its reference step right after it (`_reference`)."""

    profile: ModelProfile
    reference: float


REFERENCE_STEPS = ("--steps", "20", "--repeats", "2", "--warmup-steps", "5")
"""A reference job: 20-step fits, twice, after 5 warm-up steps (15-25 s with start-up)."""
QUICK_REFERENCE_STEPS = ("--steps", "10", "--repeats", "1", "--warmup-steps", "3")
"""The same under ``--quick``: one 10-step fit after 3 warm-up steps."""


def _reference(ex: Example, config: AdviseBenchConfig, log: IO[str],
               batch: int | None = None) -> float:
    """Seconds of one process's training step of ``ex`` now: the ``default x1`` job, short
    (at ``batch`` rows, default the example's). Against the same reading right after the
    profile, it says how fast a process of this model trains now (`Cluster.speed`), under
    the machine's load of this moment."""
    steps = QUICK_REFERENCE_STEPS if config.quick else REFERENCE_STEPS
    args = ["--example", ex.name, "--train", "--batch", str(batch or ex.batch), *steps]
    got = jobs.first_report(jobs.run_local(_MODULE, args, env=config.child_env(ex), log=log,
                                           timeout=config.timeout))
    return float(got["step_s"])


def _profile(ex: Example, config: AdviseBenchConfig, log: IO[str],
             reference: bool = True) -> Profiled:
    """``ex``'s profile; with ``reference``, its whole step read again as the jobs meet it: a
    fresh one-process job at each batch the profile measured (`_reference`), since a step
    measured in one process after other batches runs faster than a job's (the LM's 16-row
    step: 12.5 ms in the profile after its 4- and 8-row steps, 16.1-16.6 in a fresh process,
    whether fit on a plain or a distributed dataset)."""
    args = ["--example", ex.name, "--profile", "--batch", str(ex.batch), "--repeats",
            str(3 if config.quick else max(5, config.repeats))]
    got = dict(jobs.first_report(jobs.run_local(_MODULE, args, env=config.child_env(ex),
                                                log=log, timeout=config.timeout)))
    got.pop(RUN_QUEUE, None)
    prof = ModelProfile.from_json(got)
    if not reference:
        return Profiled(prof, float("nan"))
    batches = sorted({int(b) for b, _ in prof.step.points} | {ex.batch})
    if config.quick:  # one fresh job, at the global batch; the profile's curve scaled to it
        whole = _reference(ex, config, log)
        scale = whole / prof.step.at(ex.batch)
        steps = [prof.step.at(b) * scale for b in batches]
    else:
        steps = [_reference(ex, config, log, b) for b in batches]
    return Profiled(dataclasses.replace(prof, step=fit_curve(batches, steps)), steps[-1])


def _cores(processes: int) -> dict[str, float]:
    """The cores ``processes`` busy processes get now, and the 1-minute load average."""
    return {"cores": usable_cores(processes), "load": os.getloadavg()[0]}


def _mean(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """The load a run met: the mean of the readings before and after it.

    Example:
        >>> _mean({"cores": 2.0, "load": 1.0}, {"cores": 1.0, "load": 3.0})
        {'cores': 1.5, 'load': 2.0}
    """
    return {k: (before[k] + after[k]) / 2 for k in before}


def _measure(c: Candidate, ex: Example, config: AdviseBenchConfig, profiled: Profiled,
             previous: float, log: IO[str]) -> tuple[float, dict[str, Any]]:
    """Seconds per global batch of ``c``, and the load its run met: the cores its processes
    got and the reference step (``previous``: the one before it; then one after it), each
    the mean of a reading before and after; ``speed``: the profile's whole step (the same
    quantity: one process's training step at the global batch, measured in a few seconds)
    over that reference."""
    processes = min(config.np, os.cpu_count() or 1)
    before = _cores(processes)
    result = RUNNERS[c.strategy](c, ex, config, log)
    load = _mean(before, _cores(processes))
    after = _reference(ex, config, log)
    reports = result.values() if isinstance(result, Mapping) else ()
    now = (previous + after) / 2
    load |= {"reference_ms": 1e3 * now, "reference_after": after,
             "speed": profiled.profile.step.at(ex.batch) / now,
             "run_queue": run_queue_slowdown(reports)}
    return _measured_step(c, ex, result), load


def flavour_of(ex: Example) -> str:
    """The Keras ``ex``'s jobs train with: tf-keras (the jobs' default), Keras 3 where its
    environment says so."""
    return "keras3" if ex.env.get(LEGACY_KERAS_ENV) == "0" else "tf_keras"


def measure_overheads(wanted: Iterable[Candidate], ex: Example, net: network.Constants,
                      config: AdviseBenchConfig, log: IO[str],
                      budget: Budget | None = None) -> network.Constants:
    """``net`` with the overhead of each layout in ``wanted`` that it lacks under ``ex``'s
    Keras: each of the `NULLS` trained under the layout (the same runner and timing as the
    examples), less what the formulas predict for it from its own profile, gives a residual;
    the two residuals give ``(base, per_weight)`` (each at least 0: where the formulas price
    it all, none); then the cores a process's helper threads keep busy while it sleeps after
    the larger null's training (Horovod's background loop). One-process layouts have none
    (the profile is theirs)."""
    nulls = [dataclasses.replace(null, env=dict(ex.env)) for null in NULLS]
    flavour = flavour_of(ex)
    known = {k: dict(v) for k, v in net.overheads.items()}
    have = known.setdefault(flavour, {})
    todo = [c for c in wanted if c.processes > 1 and c.label not in have]
    if not todo:
        return net
    profiles = [_profile(null, config, log, reference=False).profile for null in nulls]
    cluster = Cluster(processes=config.np, cores=usable_cores(min(config.np, os.cpu_count() or 1)))
    idle, links = ["--idle-seconds", str(IDLE_SECONDS)], links_of(net)
    for c in todo:
        if budget is not None and not budget.allows(f"overhead of {c.label} ({flavour})"):
            continue
        print(f"[tfdist-bench] advise overhead ({flavour}): {c.label} ...", flush=True)
        results = [RUNNERS[c.strategy](c, null, config, log, extra) for null, extra in
                   zip(nulls, ([], idle), strict=True)]
        residual = [_measured_step(c, null, result)
                    - predict(c, prof, links, cluster, null.batch).step_s
                    for null, prof, result in zip(nulls, profiles, results, strict=True)]
        helper = jobs.first_report(results[-1]).get(HELPER_CORES) or 0.0
        have[c.label] = (*overhead_line([prof.weight_tensors for prof in profiles], residual),
                         round(float(helper), 4))
    return dataclasses.replace(net, overheads=known)


IDLE_SECONDS = 1.5
"""How long a null job's processes sleep after training to show what their helper threads use."""


def overhead_line(weights: Sequence[int], residual: Sequence[float]) -> tuple[float, float]:
    """``(base, per_weight)`` through two nulls' residual seconds, neither below 0.

    Example:
        >>> overhead_line([8, 64], [0.003, 0.010])          # 0.125 ms a weight, 2 ms base
        (0.002, 0.000125)
        >>> overhead_line([8, 64], [0.004, 0.001])          # fewer with more weights: flat
        (0.0025, 0.0)
    """
    (w0, w1), (r0, r1) = weights, residual
    per_weight = max(0.0, (r1 - r0) / (w1 - w0))
    if per_weight == 0.0:
        return max(0.0, (r0 + r1) / 2), 0.0
    base = max(0.0, r0 - per_weight * w0)
    return round(base, 12), round(per_weight, 12)


def _chosen(advice: Any, ex: Example, top: int) -> list[Any]:
    picked = list(advice.predictions[:top])
    if all(p.candidate.strategy != ex.headline for p in picked):
        picked += [next(p for p in advice.predictions if p.candidate.strategy == ex.headline)]
    return picked


def run_example(ex: Example, net: network.Constants, config: AdviseBenchConfig,
                log: IO[str], budget: Budget | None = None,
                ) -> tuple[list[dict[str, Any]], dict[str, Any], network.Constants]:
    """Profiles, advises and measures one example: one row per measured candidate, the
    profile (as JSON), and ``net`` with the overheads of the layouts considered (under
    ``quick``: of the candidates run alone; the others are ranked without theirs)."""
    budget = budget or Budget(None)
    profiled = _profile(ex, config, log)
    prof = profiled.profile
    # What the processes really get on this (shared) machine, measured just after the profile.
    cores = usable_cores(min(config.np, os.cpu_count() or 1))
    cluster = Cluster(processes=config.np, cores=cores)
    ask = lambda constants: advise(  # noqa: E731
        None, cluster, batch=ex.batch, constants=constants, profile=prof, micro_batches=(4,),
        max_ps=1, script=f"keras_examples/{ex.name}.py", flavour=flavour_of(ex))
    first = ask(net)
    wanted = _chosen(first, ex, config.top) if config.quick else first.predictions
    net = measure_overheads((p.candidate for p in wanted), ex, net, config, log, budget)
    advice = ask(net)
    overheads = net.overheads_of(flavour_of(ex))
    rows, previous = [], profiled.reference
    # Under quick, the candidates whose overheads were measured (the ranking may move them).
    labels = {w.candidate.label for w in wanted}
    runs = [p for p in advice.predictions if p.candidate.label in labels] if config.quick \
        else _chosen(advice, ex, config.top)
    for p in runs:
        c = p.candidate
        if not budget.allows(f"{ex.name}: {c.label}", first_row=True):
            continue
        print(f"[tfdist-bench] advise {ex.name}: {c.label} ...", flush=True)
        try:
            measured, load = _measure(c, ex, config, profiled, previous, log)
        except LaunchError as err:  # a job failed or timed out: the table goes on without it
            if not config.quick:
                raise
            budget.failed.append(f"{ex.name}: {c.label} ({type(err).__name__})")
            continue
        previous = load.pop("reference_after")
        met = dataclasses.replace(cluster, cores=load["cores"], speed=load["speed"])
        now = predict(c, prof, links_of(net), met, ex.batch, overheads)
        budget.measured += 1
        rows.append({"example": ex.name, "candidate": c.label,
                     "predicted_rank": advice.predictions.index(p) + 1,
                     "predicted_ms": now.step_s * 1e3, "measured_ms": measured * 1e3,
                     "error": now.step_s / measured - 1, "why": now.why(),
                     "at_profile_ms": p.step_s * 1e3,
                     "at_profile_error": p.step_s / measured - 1, **load})
    return rows, {**prof.to_json(), "reference_ms": profiled.reference * 1e3}, net


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median absolute error; per example, the first choice against the measured fastest."""
    verdicts = {}
    for name in dict.fromkeys(r["example"] for r in rows):
        mine = [r for r in rows if r["example"] == name]
        first = min(mine, key=lambda r: r["predicted_rank"])
        fastest = min(mine, key=lambda r: r["measured_ms"])
        verdicts[name] = {"first_choice": first["candidate"], "fastest": fastest["candidate"],
                          "first_over_fastest": first["measured_ms"] / fastest["measured_ms"],
                          "ok": first["measured_ms"] <= 1.10 * fastest["measured_ms"]}
        for r in mine:
            r["measured_rank"] = sorted(m["measured_ms"] for m in mine).index(r["measured_ms"]) + 1
    errors = [abs(r["error"]) for r in rows]
    at_profile = [abs(r["at_profile_error"]) for r in rows if "at_profile_error" in r]
    others = [abs(r["error"]) for r in rows if r["candidate"] != "default x1"]
    return {"median_abs_error": statistics.median(errors) if errors else None,
            "median_abs_error_at_profile": statistics.median(at_profile) if at_profile else None,
            "median_abs_error_without_default": statistics.median(others) if others else None,
            "first_choice": verdicts}


def run(config: AdviseBenchConfig, log: IO[str]) -> dict[str, Any]:
    """Runs the probe and every example; returns the section's JSON. Constants it measured
    in full (not ``quick``, not given) replace the advisor's cache of this machine
    (`network.default_path`), layout overheads included, so ``tfdist-advise`` prices them."""
    budget = Budget(config.budget_s)  # the probe's time counts too
    if config.constants:
        net = network.load(config.constants)
    else:
        sizes = network.PROBE_SIZES[1:3] if config.quick else network.PROBE_SIZES
        net = network.probe(p=config.np, sizes=sizes, repeats=config.repeats, log=log)
    rows: list[dict[str, Any]] = []
    profiles: dict[str, Any] = {}
    for ex in config.examples:
        if not budget.allows(f"{ex.name} (all of it)", first_row=True):
            continue
        got, profiles[ex.name], net = run_example(ex, net, config, log, budget)
        rows += got

    if not (config.constants or config.quick):  # measured here, in full: tfdist-advise's cache
        saved = network.save(net, network.default_path())
        print(f"[tfdist-bench] advise: the constants, layout overheads included, saved to {saved} "
              "(tfdist-advise on this machine reads them)", flush=True)
    summary = summarize(rows)
    noise = "".join(f" Noise: {line}." for line in net.noise)
    seconds = time.monotonic() - budget.started
    return {"np": config.np, "steps": config.steps, "repeats": config.repeats,
            "rows": rows, "constants": net.to_json(), "profiles": profiles, **summary,
            "skipped": budget.skipped, "failed": budget.failed, "seconds": round(seconds, 1),
            "note": note(summary) + noise + machine_noise(rows, seconds) + budget.note()}


def note(summary: Mapping[str, Any]) -> str:
    """Two lines under the table: the median error and each example's first choice."""
    error = summary["median_abs_error"]
    picks = "; ".join(
        f"{name}: first choice {v['first_choice']}, measured fastest {v['fastest']} "
        f"({'ok' if v['ok'] else 'MISSED'}, {v['first_over_fastest']:.2f}x)"
        for name, v in summary["first_choice"].items())
    at_profile = summary.get("median_abs_error_at_profile")
    others = summary.get("median_abs_error_without_default")
    before = (f" ({others:.0%} without the default x1 rows, {at_profile:.0%} predicted at "
              "profile time)" if at_profile is not None and others is not None else "")
    return (f"Median absolute error {error:.0%}{before} (target <= 25%). {picks}."
            if error is not None else "No rows.")
