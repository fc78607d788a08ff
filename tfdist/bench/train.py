"""``train``: samples/s of one model under each strategy at 1 and N replicas, and wrapper overhead.

Jobs (one ``workers/train_worker.py`` job each): ``default`` on 1 process, ``multi_worker`` on 1
and N workers, ``horovod`` on 1 and N ranks (N only with ``quick``). Inside each job tfdist's way
and the raw TF/Horovod way train the same model in alternating ``fit`` calls; ``multi_worker``
alternates whole jobs instead (tfdist, raw, raw, tfdist: ``mw_job_pairs`` pairs), because two
multi-worker strategies in one process can hang. So:

* ``samples_per_s``: median over repeats of samples / seconds of one ``fit``;
* ``overhead``: median over repeats of the paired ratio ``t(variant) / t(raw) - 1`` (positive:
  tfdist is slower). Target: within 3 %. ``raw_control`` (a second copy of ``raw``, in the
  in-process jobs) shows the A/A noise floor: an overhead below it cannot be told from zero;
* ``scaling``: ``thr(N) / (N * thr(1))`` against the same strategy and variant at 1 replica, and
  against ``default`` at 1 process (``vs_default``).

Example:
    >>> TrainConfig(quick=True).jobs()
    [('default', 1), ('multi_worker', 2), ('horovod', 2)]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from tfdist.bench.workers import WORKERS
from tfdist.cluster import ClusterSpec
from tfdist.probe import jobs
from tfdist.probe.common import median

__all__ = ["TrainConfig", "run", "summarize"]

_MODULE = "tfdist.bench.workers.train_worker"


@dataclass
class TrainConfig:
    """What to train and how long. ``env`` goes to every child (threads, Horovod knobs)."""

    np: int = 2
    quick: bool = False
    steps: int = 200
    warmup_steps: int = 20
    repeats: int = 5
    batch: int = 64
    implementation: str = "ring"
    bytes_per_pack: int = 0
    strategies: tuple[str, ...] = ("default", "multi_worker", "horovod")
    mw_job_pairs: int = 1
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 600.0

    def jobs(self) -> list[tuple[str, int]]:
        """(strategy, replicas) of every job, in the order they run."""
        out = [("default", 1)] if "default" in self.strategies else []
        for name in ("multi_worker", "horovod"):
            if name in self.strategies:
                out += [(name, self.np)] if self.quick else [(name, 1), (name, self.np)]
        return out

    def worker_args(self, mode: str) -> list[str]:
        return ["--mode", mode, "--batch", str(self.batch), "--steps", str(self.steps),
                "--warmup-steps", str(self.warmup_steps), "--repeats", str(self.repeats),
                "--implementation", self.implementation,
                "--bytes-per-pack", str(self.bytes_per_pack)]


def _run_job(config: TrainConfig, strategy: str, n: int, log: IO[str]) -> dict[str, Any]:
    args, kw = config.worker_args(strategy), {"env": config.env, "log": log,
                                              "timeout": config.timeout}
    if strategy == "default":
        return jobs.first_report(jobs.run_local(_MODULE, args, **kw))
    if strategy == "horovod":
        return jobs.first_report(jobs.run_horovod(n, _MODULE, args, **kw))
    order = ["tfdist", "raw", "raw", "tfdist"] * config.mw_job_pairs
    merged: dict[str, Any] = {"seconds": {"tfdist": [], "raw": []}, "samples_per_fit": {}}
    for variant in order[:2 * config.mw_job_pairs]:
        spec = ClusterSpec.local(workers=n, host="127.0.0.1")
        got = jobs.first_report(jobs.run_tf(spec, WORKERS / "train_worker.py",
                                            [*args, "--variant", variant], **kw))
        merged["seconds"][variant] += got["seconds"][variant]
        merged["samples_per_fit"].update(got["samples_per_fit"])
    return merged


def summarize(strategy: str, n: int, raw: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per variant: samples/s and the paired overhead against ``raw``."""
    seconds, samples = raw["seconds"], raw["samples_per_fit"]
    rows = []
    for variant, times in seconds.items():
        row = {"strategy": strategy, "replicas": n, "variant": variant,
               "samples_per_s": median([samples[variant] / t for t in times]),
               "fit_s": median(times), "seconds": list(times), "overhead": None}
        if variant != "raw":
            pairs = zip(times, seconds["raw"], strict=True)
            row["overhead"] = median([a / b for a, b in pairs]) - 1
        rows.append(row)
    return rows


def _add_scaling(rows: list[dict[str, Any]]) -> None:
    one = {(r["strategy"], r["variant"]): r["samples_per_s"] for r in rows if r["replicas"] == 1}
    default = one.get(("default", "tfdist"))
    for row in rows:
        n, thr = row["replicas"], row["samples_per_s"]
        base = one.get((row["strategy"], row["variant"]))
        row["scaling"] = thr / (n * base) if base and n > 1 else None
        row["scaling_vs_default"] = thr / (n * default) if default and n > 1 else None


def run(config: TrainConfig, log: IO[str]) -> dict[str, Any]:
    """Runs every job in turn; returns the section's JSON."""
    rows: list[dict[str, Any]] = []
    for strategy, n in config.jobs():
        rows += summarize(strategy, n, _run_job(config, strategy, n, log))
    _add_scaling(rows)
    return {"np": config.np, "steps": config.steps, "repeats": config.repeats,
            "batch_per_replica": config.batch, "implementation": config.implementation,
            "bytes_per_pack": config.bytes_per_pack, "env": dict(config.env), "rows": rows}
