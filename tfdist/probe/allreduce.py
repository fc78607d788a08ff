"""``allreduce``: bus bandwidth of TF's collective ring and Horovod (Gloo, MPI) against limits.

For each message size ``S`` (float32 tensors) and each backend, on ``N`` processes:

* ``t``: the median over repeats (after warm-up) of the slowest rank's time for one all-reduce;
* ``algbw = S / t`` and ``busbw = algbw * 2 (N - 1) / N`` (NCCL-tests' definitions: busbw is the
  per-link rate a ring all-reduce achieves, comparable across N);
* ``limit``: ``S / t_tcp`` of a `tfdist.probe.common.TcpRing` exchange of ``S`` bytes, timed in the
  same processes, interleaved with the all-reduce (A B A B ...), so drift on a shared machine
  hits both alike. ``busbw / limit`` is how close the backend comes to what the sockets carry.
* ``copy``: ``S / t_copy`` of one in-memory copy of ``S`` bytes in each process, the ceiling for
  a transport that moves data through shared memory (MPI between ranks on one host), which can
  beat the TCP limit.

Example:
    >>> [size_label(s) for s in default_sizes(quick=True)]
    ['16 KiB', '1 MiB', '4 MiB']
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tfdist.cluster import ClusterSpec
from tfdist.probe import jobs
from tfdist.probe.common import median

__all__ = ["AllreduceConfig", "default_sizes", "size_label", "run", "summarize"]

_WORKER = Path(__file__).resolve().parent / "allreduce_worker.py"

BACKENDS = ("tf", "horovod", "horovod-mpi")
"""``horovod-mpi`` is Horovod over ``horovodrun --mpi`` (skipped with a note where OpenMPI is not
installed)."""


def default_sizes(quick: bool = False) -> list[int]:
    """4 KiB to 64 MiB in powers of 4 (quick: three sizes)."""
    if quick:
        return [16 << 10, 1 << 20, 4 << 20]
    return [4 << (10 + 2 * i) for i in range(8)]


def size_label(nbytes: int) -> str:
    """``4096`` -> ``"4 KiB"``."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):g} {unit}"
    return f"{nbytes} B"


@dataclass
class AllreduceConfig:
    """What to measure. ``env`` goes to every child (threads, Horovod knobs)."""

    np: int = 2
    sizes: list[int] = field(default_factory=default_sizes)
    warmup: int = 2
    repeats: int = 7
    backends: Sequence[str] = BACKENDS
    implementation: str = "ring"
    bytes_per_pack: int = 0
    compression: str = "none"
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 600.0


def _worker_args(config: AllreduceConfig, backend: str) -> list[str]:
    return ["--backend", backend, "--sizes", ",".join(map(str, config.sizes)),
            "--warmup", str(config.warmup), "--repeats", str(config.repeats),
            "--implementation", config.implementation,
            "--bytes-per-pack", str(config.bytes_per_pack), "--compression", config.compression]


def _run_backend(config: AllreduceConfig, backend: str, log: IO[str]) -> dict[str, Any]:
    with jobs.ring_ports(config.np) as ring_env:
        env = {**config.env, **ring_env}
        if backend == "tf":
            spec = ClusterSpec.local(workers=config.np, host="127.0.0.1")
            return jobs.run_tf(spec, _WORKER, _worker_args(config, "tf"), env=env,
                               log=log, timeout=config.timeout)
        # horovod and horovod-mpi run the same worker code; only horovodrun's controller differs.
        controller = "mpi" if backend == "horovod-mpi" else "gloo"
        return jobs.run_horovod(config.np, "tfdist.probe.allreduce_worker",
                                _worker_args(config, "horovod"), env=env, log=log,
                                timeout=config.timeout, controller=controller)


def summarize(backend: str, ranks: Mapping[str, Any], n: int) -> list[dict[str, Any]]:
    """One row per size from every rank's raw times (slowest rank per repeat, then median)."""
    if len(ranks) != n:
        raise RuntimeError(f"{backend}: {len(ranks)} of {n} ranks reported ({sorted(ranks)})")
    rows = []
    for size_key in next(iter(ranks.values()))["sizes"]:
        per_rank = [r["sizes"][size_key] for r in ranks.values()]
        t = median([max(v) for v in zip(*(r["allreduce_s"] for r in per_rank), strict=True)])
        t_tcp = median([max(v) for v in zip(*(r["tcp_s"] for r in per_rank), strict=True)])
        t_copy = median([max(v) for v in zip(*(r["copy_s"] for r in per_rank), strict=True)])
        nbytes = int(size_key)
        busbw = nbytes / t * 2 * (n - 1) / n / 1e9
        limit = nbytes / t_tcp / 1e9
        rows.append({"backend": backend, "bytes": nbytes, "size": size_label(nbytes),
                     "time_ms": t * 1e3, "algbw_GBps": nbytes / t / 1e9, "busbw_GBps": busbw,
                     "limit_GBps": limit, "busbw_over_limit": busbw / limit,
                     "copy_GBps": nbytes / t_copy / 1e9})
    return rows


def run(config: AllreduceConfig, log: IO[str]) -> dict[str, Any]:
    """Measures every backend in turn; returns the section's JSON."""
    rows: list[dict[str, Any]] = []
    skipped = {}
    for backend in config.backends:
        if backend == "horovod-mpi" and shutil.which("mpirun") is None:
            skipped[backend] = "OpenMPI's mpirun is not installed (bash launch/setup.sh as root)"
            log.write(f"allreduce: skipping {backend}: {skipped[backend]}\n")
            continue
        rows += summarize(backend, _run_backend(config, backend, log), config.np)
    return {"np": config.np, "warmup": config.warmup, "repeats": config.repeats,
            "implementation": config.implementation, "bytes_per_pack": config.bytes_per_pack,
            "compression": config.compression, "env": dict(config.env), "rows": rows,
            "skipped": skipped}
