"""``pipeline``: step time of a K=2 pipeline against its schedule's bound, and against data
parallel.

Jobs (one ``workers/pipeline_worker.py`` job each, one compute thread per process so each stage
has a core, and two inter-op threads: with one, a stage's sends and receives wait behind its
compute and the stages run one after the other, 1.95x the bound at M=8 against 1.2x with two):
the same deep MLP of equal layers and the same global batch under ``pipeline`` with K = 2 stages
and M = 1, 2, 4, 8 micro-batches, under ``multi_worker`` on the same 2 processes, and under
``default`` on one. Per pipeline row:

* ``step_s``: the pipelined step (custom-loop path: schedule, transfers, one update);
* ``ideal_s``: the schedule's bound ``(M + idle slots) * t_stage`` (GPipe's: ``(M + K - 1) *
  t_stage``), with ``t_stage`` the slowest stage's forward + backward of one micro-batch measured
  alone in the same job, in rounds alternating with the steps (so the bubble is the only idle
  time the bound allows, and both times see the same machine load); the idle slots and
  ``bubble`` come from the schedule's simulation (`PipelineSchedule.idle_slots`, ``bubble``);
* ``measured_over_ideal``: the step over the bound, as the median over rounds of neighbouring
  measurements (steadier than ``step_s / ideal_s`` on a shared machine; 1.0: no cost beyond the
  bubble; the target is <= 1.15 at M >= 4 for a compute-bound stage, which the default batch of
  1024 rows gives);
* the row ``pipeline interleaved v=2`` (at the ``interleaved`` M): Megatron's interleaved 1F1B,
  each process holding 2 chunks; its bound is ``(M + (K-1)/v) * t_stage``, ``t_stage`` the
  process's work on one micro-batch over its chunks, and ``bubble`` ``(K-1)/(v M + K - 1)``;
* the rows ``pipeline 1f1b`` and ``pipeline zb-h1`` (at the ``zero_bubble`` M): each against
  its bound; the ZB-H1 job also times 1F1B's step of the same stages in the same rounds
  (``one_f_one_b_s``), and ``vs_1f1b`` is the median over rounds of ZB-H1's step over 1F1B's in
  the same round (below 1: faster; steps of different jobs are not comparable on a shared
  machine);
* ``fit_step_s``: the same step under ``model.fit``, steady (timed step to step by a callback,
  the first step of the call left out; every row);
* ``fit_over_loop``: ``fit_step_s / step_s``, a ``fit`` step against the custom-loop step;
* ``fit_call_s``: what one ``fit`` call spends outside its steps (tf-keras's data adapter,
  distributed dataset and iterator, callbacks): a fixed cost per call, apart from the steps;
* ``speedup_vs_default``: one process's ``fit`` step time / this job's.

And ``memory`` rows (`workers/peak_worker.py`, an MLP whose activations outweigh its weights:
width 256, 8 layers, ``memory_rows`` rows per batch, Adam, 3 steps): the peak resident memory
``fit`` adds, per stage of a K-stage GPipe pipeline at ``memory_micro_batches`` micro-batches
with and without activation recomputation, and for one process training the whole model.

Example:
    >>> PipelineConfig(quick=True).micro_batches
    (1, 4)
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any

from tfdist.bench.memory import MALLOC_ENV
from tfdist.bench.workers import WORKERS
from tfdist.cluster import ClusterSpec
from tfdist.pipeline.schedule import schedule_class
from tfdist.probe import jobs

__all__ = ["PipelineConfig", "run", "pipeline_row"]

_MODULE = "tfdist.bench.workers.pipeline_worker"
_SCRIPT = WORKERS / "pipeline_worker.py"
_PEAK_MODULE = "tfdist.bench.workers.peak_worker"
_PEAK_SCRIPT = WORKERS / "peak_worker.py"


@dataclass
class PipelineConfig:
    """The model, batch, micro-batch counts and timing rounds (each: the stage alone, then the
    pipelined step, 4 times). ``env`` goes to every child."""

    quick: bool = False
    stages: int = 2
    batch: int = 1024
    width: int = 1024
    depth: int = 8
    steps: int = 20
    micro_batches: tuple[int, ...] = (1, 2, 4, 8)
    interleaved: tuple[int, ...] = (4, 8)
    chunks: int = 2
    zero_bubble: tuple[int, ...] = (4, 8)
    rounds: int = 6
    memory_rows: int = 8192
    memory_micro_batches: int = 4
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.quick:  # every job once, each as small as its row allows
            self.micro_batches, self.interleaved, self.rounds = (1, 4), (4,), 2
            self.zero_bubble = ()
            self.width, self.batch, self.depth, self.memory_rows = 128, 128, 4, 1024

    def args(self, mode: str, micro_batches: int = 1, chunks: int = 1,
             schedule: str = "gpipe", compare: str | None = None) -> list[str]:
        return ["--mode", mode, "--micro-batches", str(micro_batches), "--batch",
                str(self.batch), "--width", str(self.width), "--depth", str(self.depth),
                "--steps", str(self.steps), "--chunks", str(chunks), "--rounds",
                str(self.rounds), "--schedule", schedule,
                *(["--compare", compare] if compare else [])]

    def runs(self) -> list[tuple[int, str, int, str | None]]:
        """``(M, schedule, chunks, schedule timed beside it)`` of each pipeline job, in the
        order of its rows.

        Example:
            >>> PipelineConfig(micro_batches=(4,), interleaved=(), zero_bubble=(8,)).runs()
            [(4, 'gpipe', 1, None), (8, '1f1b', 1, None), (8, 'zb-h1', 1, '1f1b')]
        """
        runs = [(micro, "gpipe", 1, None) for micro in self.micro_batches]
        runs += [(micro, "interleaved", self.chunks, None) for micro in self.interleaved]
        return runs + [run for micro in self.zero_bubble
                       for run in ((micro, "1f1b", 1, None), (micro, "zb-h1", 1, "1f1b"))]


def run(config: PipelineConfig, log: IO[str]) -> dict[str, Any]:
    """Runs every job; returns ``{"rows": [...]}`` (one row per job) and the ``memory`` rows.

    With ``quick``, the memory jobs run beside the timing jobs (a smoke run, not a measurement:
    the quick section took 13.6 s instead of 18.3, back to back on 2 cores); otherwise after
    them, so that neither measures under the other's load.
    """
    env = {"TFDIST_BENCH_THREADS": "2,1", **config.env}
    timeout = 600.0
    with ThreadPoolExecutor(max_workers=1) as beside:
        memory = beside.submit(_memory_rows, config, env, log, timeout) if config.quick else None
        result = _timing_rows(config, env, log, timeout)
        result["memory"] = (memory.result() if memory is not None
                            else _memory_rows(config, env, log, timeout))
    return result


def _timing_rows(config: PipelineConfig, env: Mapping[str, str], log: IO[str],
                 timeout: float) -> dict[str, Any]:
    """The ``default``, pipeline and ``multi_worker`` jobs' rows, and the model."""
    single = jobs.first_report(jobs.run_local(_MODULE, config.args("default"), env=env,
                                              log=log, timeout=timeout))
    rows = [{"mode": "default", "processes": 1, "micro_batches": "-",
             "fit_step_s": single["step_s"], "fit_call_s": single["fit_call_s"],
             "speedup_vs_default": 1.0}]
    for micro, schedule, chunks, compare in config.runs():
        args = config.args("pipeline", micro, chunks, schedule, compare)
        results = _pipeline_job(config, args, env, log, timeout)
        rows.append(pipeline_row(config.stages, micro, schedule, chunks, results,
                                 single["step_s"]))
    spec = ClusterSpec.local(workers=config.stages)
    data_parallel = jobs.first_report(jobs.run_tf(
        spec, _SCRIPT, config.args("multi_worker"), env={**env, "TFDIST_STRATEGY":
                                                         "multi_worker"}, log=log,
        timeout=timeout))
    rows.append({"mode": "multi_worker", "processes": config.stages, "micro_batches": "-",
                 "fit_step_s": data_parallel["step_s"], "fit_call_s": data_parallel["fit_call_s"],
                 "speedup_vs_default": single["step_s"] / data_parallel["step_s"]})
    return {"rows": rows, "model": {"width": config.width, "depth": config.depth,
                                    "batch": config.batch}}


def _memory_rows(config: PipelineConfig, env: Mapping[str, str], log: IO[str],
                 timeout: float) -> list[dict[str, Any]]:
    """Peak memory ``fit`` adds: one process, then each stage without and with recomputation."""
    env = {**env, **MALLOC_ENV}
    args = ["--rows", str(config.memory_rows), "--micro-batches",
            str(config.memory_micro_batches)]
    whole = jobs.first_report(jobs.run_local(_PEAK_MODULE, [*args, "--mode", "default"],
                                             env=env, log=log, timeout=timeout))
    rows = [_memory_row("one process, whole model", "-", [whole])]
    spec = ClusterSpec.local(workers=config.stages)
    for recompute in (False, True):
        results = jobs.run_tf(spec, _PEAK_SCRIPT, [*args, *(["--recompute"] * recompute)],
                              env={**env, "TFDIST_STRATEGY": "pipeline",
                                   "TFDIST_PIPELINE_STAGES": str(config.stages)},
                              log=log, timeout=timeout)
        rows.append(_memory_row("pipeline GPipe" + (", recompute" if recompute else ""),
                                config.memory_micro_batches,
                                sorted(results.values(), key=lambda r: r["stage"])))
    return rows


def _memory_row(mode: str, micro_batches: int | str,
                reports: list[dict[str, Any]]) -> dict[str, Any]:
    growth = [r["growth_bytes"] / 2**20 for r in reports]
    return {"mode": mode, "micro_batches": micro_batches, "growth_mb": growth,
            "per_stage": " / ".join(f"{mb:.0f}" for mb in growth)}


def _pipeline_job(config: PipelineConfig, args: list[str], env: Mapping[str, str],
                  log: IO[str], timeout: float) -> dict[str, dict[str, Any]]:
    """One pipeline job's reports, by task."""
    spec = ClusterSpec.local(workers=config.stages)
    return jobs.run_tf(spec, _SCRIPT, args,
                       env={**env, "TFDIST_STRATEGY": "pipeline",
                            "TFDIST_PIPELINE_STAGES": str(config.stages)},
                       log=log, timeout=timeout)


def pipeline_row(stages: int, micro: int, schedule: str, chunks: int,
                 results: Mapping[str, Mapping[str, Any]], single_s: float) -> dict[str, Any]:
    """The row of one pipeline job (its tasks' ``results``) against its schedule's bound
    (and against the schedule its job timed beside it, if any).

    Example:
        >>> report = {"stage_s": 0.1, "loop_step_s": 0.45, "over_bound": 1.05,
        ...           "step_s": 0.5, "fit_call_s": 0.2, "other_step_s": 0.5, "over_other": 0.9}
        >>> row = pipeline_row(2, 4, "zb-h1", 1, {"worker:0": report}, single_s=0.8)
        >>> row["mode"], round(row["ideal_s"], 4), round(row["bubble"], 3), row["vs_1f1b"]
        ('pipeline zb-h1', 0.4333, 0.077, 0.9)
    """
    plan = schedule_class(schedule)(stages, micro, chunks)
    stage_s = max(r["stage_s"] for r in results.values())
    loop_s = max(r["loop_step_s"] for r in results.values())
    first = jobs.first_report(results)
    mode = "pipeline" + ("" if schedule == "gpipe" else f" {schedule}") + (
        f" v={chunks}" if chunks > 1 else "")
    return {"mode": mode, "schedule": schedule, "processes": stages, "micro_batches": micro,
            "step_s": loop_s,
            "ideal_s": (micro + plan.idle_slots()) * stage_s,
            "measured_over_ideal": max(r["over_bound"] for r in results.values()),
            "bubble": plan.bubble(),
            "fit_step_s": first["step_s"], "fit_over_loop": first["step_s"] / loop_s,
            "fit_call_s": first["fit_call_s"], "speedup_vs_default": single_s / first["step_s"],
            "one_f_one_b_s": first.get("other_step_s"), "vs_1f1b": first.get("over_other")}
