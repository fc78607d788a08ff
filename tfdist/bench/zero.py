"""``zero``: ZeRO stages 0-3 side by side on the same model, processes and global batches.

Two jobs of ``workers/zero_worker.py`` on D processes: ``multi_worker`` (stage 0, replicated:
every process holds the weights, the gradients and Adam's two slots whole) and one job running
stages 1, 2 and 3 in turn. Per row:

* ``step_s``: a ``fit`` step on the global batch (after a warm-up fit);
* ``weights``, ``pieces``, ``slots``: bytes one process holds between steps (the model's
  trainable weights with values, its parts' master copies, the optimizer's variables);
* ``sent``: bytes one process sends per step in the collectives of dense weights and gradients
  (ring model; `tfdist.zero.engine.ZeroEngine.step_traffic`), and ``sent_over_bound``: that
  against the replicated all-reduce's (stages 1-2's bound: 1.0; stage 3's: 1.5, each layer's
  weights gathered twice per step, for its forward and again for its backward).

Example:
    >>> ZeroBenchConfig(quick=True).width
    128
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from tfdist.bench.workers import WORKERS
from tfdist.cluster import ClusterSpec
from tfdist.probe import jobs

__all__ = ["ZeroBenchConfig", "run"]

_SCRIPT = WORKERS / "zero_worker.py"
BOUNDS = {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.5}
"""Each stage's traffic bound, in the replicated all-reduce's bytes (the issue's)."""


@dataclass
class ZeroBenchConfig:
    """The model, batch and process count. ``env`` goes to every child."""

    quick: bool = False
    np: int = 2
    vocab: int = 4096
    width: int = 512
    layers: int = 4
    batch: int = 32
    steps: int = 10
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.quick:
            self.vocab, self.width, self.layers, self.steps = 256, 128, 2, 3

    def args(self, mode: str) -> list[str]:
        return ["--mode", mode, "--vocab", str(self.vocab), "--width", str(self.width),
                "--layers", str(self.layers), "--batch", str(self.batch),
                "--steps", str(self.steps)]


def _rows(report: Mapping[str, Any], replicated_sent: float) -> list[dict[str, Any]]:
    rows = []
    for stage, row in sorted(report.items()):
        sent = row["sent"] / replicated_sent if replicated_sent else None
        rows.append({"stage": int(stage), **row, "sent_over_replicated": sent,
                     "bound": BOUNDS[int(stage)],
                     "held": row["weights"] + row["pieces"] + row["slots"]})
    return rows


def run(config: ZeroBenchConfig, log: IO[str]) -> dict[str, Any]:
    """Runs both jobs; returns ``{"rows": [...]}`` (one row per stage)."""
    env = {"TFDIST_BENCH_THREADS": "2,1", "TF_USE_LEGACY_KERAS": "0", **config.env}
    reports: dict[str, Any] = {}
    for mode in ("multi_worker", "zero"):
        spec = ClusterSpec.local(workers=config.np)
        try:
            results = jobs.run_tf(spec, _SCRIPT, config.args(mode),
                                  env={**env, "TFDIST_STRATEGY": "multi_worker"}, log=log,
                                  timeout=900.0)
        except Exception as err:  # noqa: BLE001 - one job failing keeps the other's rows
            reports[mode] = {"error": str(err)[:200]}
            continue
        slowest = {stage: max((r[stage] for r in results.values()), key=lambda r: r["step_s"])
                   for stage in jobs.first_report(results)}
        reports.update(slowest)
    errors = {k: v for k, v in reports.items() if "error" in v}
    replicated = reports.get("0", {}).get("sent") or reports.get("1", {}).get("replicated")
    rows = _rows({k: v for k, v in reports.items() if k not in errors}, replicated or 0)
    for row in rows:
        row["step_over_replicated"] = (row["step_s"] / reports["0"]["step_s"]
                                       if "0" in reports and "error" not in reports["0"]
                                       else None)
    rows += [{"stage": mode, "error": v["error"]} for mode, v in errors.items()]
    return {"rows": rows, "model": {"vocab": config.vocab, "width": config.width,
                                    "layers": config.layers, "batch": config.batch,
                                    "processes": config.np},
            "note": "bytes per process; sent: dense collectives per step (ring model), "
                    "against the replicated all-reduce's; stage 1 all-reduces the gradients "
                    "and gathers the weights (1.5x), stage 2 reduce-scatters them (1.0x), "
                    "stage 3 gathers each layer for its forward and again for its backward (1.5x)."}
