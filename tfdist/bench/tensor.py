"""``tensor``: step time of a Transformer LM split T ways, against its bound, one process, data
parallel and a pipeline on the same processes.

Jobs (one ``workers/tensor_worker.py`` job each, one compute thread per process): the same LM
(``blocks`` Transformer blocks) and the same global batch under ``default`` on one process, then
on T processes under ``tensor`` (every block's heads and feed-forward pair split T ways),
``multi_worker`` (data parallel) and ``pipeline`` (K = T stages, M = 4). Per row:

* ``step_s``: a ``fit`` step on the global batch;
* ``bound_s`` (tensor): one process's step / T plus the activation all-reduces, ``4 * blocks``
  sums of a ``batch x seq x width`` float32 tensor over the tensor group (two forward, two
  backward per block), each timed alone in the same job (``allreduce_s``);
* ``measured_over_bound``: ``step_s / bound_s`` (1.0: nothing beyond split compute and the
  reduces; the rest is the split layers' own overhead and the small reductions of the loss);
* ``weight_bytes``: the weights one process holds (tensor: against ``planned_bytes``, the
  plan's prediction, split / T + replicated);
* ``speedup_vs_default``: one process's step / this job's;
* ``tokens_per_s``: ``batch x seq`` tokens of a global batch / ``step_s``.

Then the same sizes as KerasHub's ``GPT2CausalLM`` (``model: "keras_hub_gpt2"``, built from a
config, nothing downloaded; its blocks split inside, its tied token embedding by vocabulary)
under ``default``, ``tensor`` and ``multi_worker`` with the same columns and the same bound;
``weight_ratio`` there is ``weight_bytes`` over one process's (the whole model).

Example:
    >>> TensorBenchConfig(quick=True).width
    64
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from tfdist.bench.workers import WORKERS
from tfdist.cluster import ClusterSpec
from tfdist.core.registry import strategy_traits
from tfdist.launcher.mesh_plan import MESH_ENV, plan_mesh
from tfdist.launcher.options import JobOptions, StrategyOptions
from tfdist.probe import jobs

__all__ = ["TensorBenchConfig", "run"]

_MODULE = "tfdist.bench.workers.tensor_worker"
_SCRIPT = WORKERS / "tensor_worker.py"
_REDUCES_PER_BLOCK = 4


@dataclass
class TensorBenchConfig:
    """The model, batch and shard count. ``env`` goes to every child."""

    quick: bool = False
    shards: int = 2
    batch: int = 16
    vocab: int = 512
    seq: int = 64
    width: int = 256
    heads: int = 8
    blocks: int = 2
    steps: int = 10
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.quick:
            self.vocab, self.seq, self.width, self.heads, self.steps = 64, 16, 64, 4, 3

    def args(self, mode: str, model: str = "lm") -> list[str]:
        return ["--mode", mode, "--model", model, "--shards", str(self.shards),
                "--batch", str(self.batch),
                "--vocab", str(self.vocab), "--seq", str(self.seq), "--width", str(self.width),
                "--heads", str(self.heads), "--blocks", str(self.blocks),
                "--steps", str(self.steps)]


def _tensor_mesh(shards: int) -> str:
    """The mesh ``tfdist-launch --strategy tensor --tensor T --workers T`` writes (T travels
    in it alone)."""
    options = JobOptions(str(_SCRIPT), strategy="tensor", workers=shards,
                         strategy_options=StrategyOptions(tensor=shards))
    return plan_mesh(options, strategy_traits("tensor")).to_env()  # type: ignore[union-attr]


def _row(config: TensorBenchConfig, mode: str, results: Mapping[str, Any],
         single: Mapping[str, Any]) -> dict[str, Any]:
    """One job's row from its processes' reports (the slowest process's step)."""
    step = max(r["step_s"] for r in results.values())
    row = {"mode": mode, "processes": len(results), "step_s": step,
           "tokens_per_s": config.batch * config.seq / step,
           "weight_bytes": max(r["weight_bytes"] for r in results.values()),
           "weight_ratio": max(r["weight_bytes"] for r in results.values())
           / single["weight_bytes"],
           "speedup_vs_default": single["step_s"] / step}
    if mode == "tensor":
        reduce_s = max(r["allreduce_s"] for r in results.values())
        bound = single["step_s"] / config.shards + _REDUCES_PER_BLOCK * config.blocks * reduce_s
        row.update(allreduce_s=reduce_s, bound_s=bound, measured_over_bound=step / bound,
                   planned_bytes=jobs.first_report(results)["planned_bytes"])
    return row


def _rows(config: TensorBenchConfig, model: str, modes: dict[str, dict[str, str]],
          env: Mapping[str, str], log: IO[str]) -> list[dict[str, Any]]:
    """One process, then one job per mode on ``T`` processes; a failing job is a row with
    its error (the others still run)."""
    timeout = 900.0
    single = jobs.first_report(jobs.run_local(_MODULE, config.args("default", model), env=env,
                                              log=log, timeout=timeout))
    rows = [_row(config, "default", {"0": single}, single)]
    for mode, extra in modes.items():
        spec = ClusterSpec.local(workers=config.shards)
        try:
            results = jobs.run_tf(spec, _SCRIPT, config.args(mode, model),
                                  env={**env, "TFDIST_STRATEGY": mode, **extra}, log=log,
                                  timeout=timeout)
        except Exception as err:  # noqa: BLE001 - one layout failing keeps the others' rows
            rows.append({"mode": mode, "processes": config.shards, "error": str(err)[:200]})
            continue
        rows.append(_row(config, mode, results, single))
    return [{"model": model, **row} for row in rows]


def run(config: TensorBenchConfig, log: IO[str]) -> dict[str, Any]:
    """Runs every job; returns ``{"rows": [...]}`` (one row per job: the benchmark's LM, then
    KerasHub's GPT-2 at the same sizes)."""
    env = {"TFDIST_BENCH_THREADS": "2,1", "TF_USE_LEGACY_KERAS": "0", **config.env}
    tensor = {"tensor": {MESH_ENV: _tensor_mesh(config.shards)}, "multi_worker": {}}
    pipeline = {"pipeline": {"TFDIST_PIPELINE_STAGES": str(config.shards),
                             "TFDIST_PIPELINE_MICRO_BATCHES": "4"}}
    rows = _rows(config, "lm", {**tensor, **pipeline}, env, log)
    rows += _rows(config, "gpt2", tensor, env, log)
    return {"rows": rows, "model": {"vocab": config.vocab, "seq": config.seq,
                                    "width": config.width, "heads": config.heads,
                                    "blocks": config.blocks, "batch": config.batch},
            "note": "bound = one process's step / T + 4 x blocks activation all-reduces "
                    "(each timed alone); on a few CPU cores the reduces over gRPC cost more "
                    "than the compute they save, so tensor parallelism does not win there. "
                    "model gpt2: KerasHub's GPT2CausalLM at the same sizes, from its config."}
