"""``ps``: a sparse CTR model, async on 1 and 2 parameter servers vs sync multi-worker.

Jobs (``workers/ps_worker.py``): a ParameterServer cluster (chief + N workers + P ps, for each P
in ``num_ps``; the embedding is split over the ps) and an N-worker `MultiWorkerMirroredStrategy`
job. Each job times ``fit`` with every ``steps_per_execution`` value, interleaved.
``samples_per_s`` is the median over repeats of samples / seconds of one ``fit``; ``spe_speedup``
is the paired median of ``t(spe=1) / t(spe=k)``.

Example:
    >>> PsConfig(quick=True).jobs()
    [('ps', 1), ('sync', 0)]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from tfdist.bench.workers import WORKERS
from tfdist.cluster import ClusterSpec
from tfdist.probe import jobs
from tfdist.probe.common import median

__all__ = ["PsConfig", "run", "summarize"]


@dataclass
class PsConfig:
    """What to run. ``env`` goes to every child."""

    workers: int = 2
    quick: bool = False
    num_ps: tuple[int, ...] = (1, 2)
    steps: int = 100
    warmup_steps: int = 20
    repeats: int = 3
    batch: int = 256
    spe: tuple[int, ...] = (1, 10)
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 600.0

    def jobs(self) -> list[tuple[str, int]]:
        """(mode, number of ps) of every job, in the order they run."""
        ps = self.num_ps[:1] if self.quick else self.num_ps
        return [("ps", p) for p in ps] + [("sync", 0)]

    def worker_args(self, mode: str) -> list[str]:
        return ["--mode", mode, "--batch", str(self.batch), "--steps", str(self.steps),
                "--warmup-steps", str(self.warmup_steps), "--repeats", str(self.repeats),
                "--spe", ",".join(map(str, self.spe))]


def summarize(mode: str, num_ps: int, workers: int, raw: Mapping[str, Any]) -> list[dict]:
    """One row per steps_per_execution value."""
    seconds, samples = raw["seconds"], raw["samples_per_fit"]
    first = next(iter(seconds))
    return [{"mode": "async PS" if mode == "ps" else "sync multi-worker", "num_ps": num_ps,
             "workers": workers, "steps_per_execution": int(name.removeprefix("spe")),
             "samples_per_s": median([samples[name] / t for t in times]),
             "spe_speedup": median([a / b for a, b in zip(seconds[first], times, strict=True)])}
            for name, times in seconds.items()]


def run(config: PsConfig, log: IO[str]) -> dict[str, Any]:
    """Runs every job in turn; returns the section's JSON."""
    rows: list[dict[str, Any]] = []
    for mode, num_ps in config.jobs():
        spec = ClusterSpec.local(workers=config.workers, ps=num_ps, chief=mode == "ps",
                                 host="127.0.0.1")
        results = jobs.run_tf(spec, WORKERS / "ps_worker.py", config.worker_args(mode),
                              env=config.env, log=log, timeout=config.timeout)
        rows += summarize(mode, num_ps, config.workers, jobs.first_report(results))
    return {"workers": config.workers, "steps": config.steps, "repeats": config.repeats,
            "batch_per_worker_step": config.batch, "env": dict(config.env), "rows": rows}
