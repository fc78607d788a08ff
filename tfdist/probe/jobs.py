"""Starting benchmark workers: a TF cluster (`run_cluster`) or a ``horovodrun`` job (`run_tasks`).

Every job's children get ``PYTHONPATH`` pointing at this tfdist, quiet TF logs, tf-keras
(``TF_USE_LEGACY_KERAS=1``: the README's numbers were measured with it) and
the extra environment the caller passes (thread pools, Horovod knobs). Their output goes to the
log file, prefixed by task, so the terminal shows only tables.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import tfdist
from tfdist.cluster import ClusterSpec, release_ports, reserve_ports
from tfdist.launcher.horovodrun.command import horovodrun_path
from tfdist.probe.common import RING_PORTS_ENV
from tfdist.testing import run_cluster, run_tasks

__all__ = ["base_env", "first_report", "ring_ports", "run_horovod", "run_local",
           "run_tf"]

_ROOT = str(Path(tfdist.__file__).resolve().parent.parent)


def base_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every benchmark child gets, plus ``extra``."""
    path = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": "3", "TF_USE_LEGACY_KERAS": "1",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            **(extra or {})}


class ring_ports:  # noqa: N801 - used as a context manager, reads like a function
    """Reserves ``n`` loopback ports for a `TcpRing` while a job runs; yields the env entry."""

    def __init__(self, n: int) -> None:
        self.ports = reserve_ports(n, "127.0.0.1")

    def __enter__(self) -> dict[str, str]:
        return {RING_PORTS_ENV: ",".join(map(str, self.ports))}

    def __exit__(self, *exc: Any) -> None:
        release_ports(self.ports)


def run_tf(spec: ClusterSpec, script: Path, args: Sequence[str], *, env: Mapping[str, str],
           log: IO[str], timeout: float) -> dict[str, Any]:
    """Runs ``script`` on every task of ``spec`` (PS layout: chief only); frees ports."""
    try:
        return run_cluster(spec, script, list(args), env=base_env(env), stream=log,
                           timeout=timeout)
    finally:
        release_ports(spec.ports())


def run_horovod(np_: int, module: str, args: Sequence[str], *, env: Mapping[str, str],
                log: IO[str], timeout: float, controller: str = "gloo") -> dict[str, Any]:
    """Runs ``python -m <module>`` on ``np_`` Horovod ranks over ``controller`` (gloo or mpi);
    results by ``rank:<r>``."""
    argv = [horovodrun_path(), "-np", str(np_), f"--{controller}", sys.executable, "-m", module,
            *args]
    return run_tasks({"horovodrun": argv}, env={"horovodrun": base_env(env)}, stream=log,
                     timeout=timeout)


def run_local(module: str, args: Sequence[str], *, env: Mapping[str, str], log: IO[str],
              timeout: float) -> dict[str, Any]:
    """Runs ``python -m <module>`` as one process (no cluster); its result is ``chief:0``."""
    return run_tasks({"local": [sys.executable, "-m", module, *args]},
                     env={"local": base_env(env)}, stream=log, timeout=timeout)


def first_report(results: Mapping[str, Any]) -> Any:
    """The report of the chief / rank 0 / first worker (they time the same collective steps)."""
    for name in ("chief:0", "rank:0", "worker:0"):
        if name in results:
            return results[name]
    raise RuntimeError(f"no chief, rank 0 or worker 0 reported; got {sorted(results)}")
