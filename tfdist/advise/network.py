"""Network constants (alpha, beta, gamma) from a short real probe, fitted by least squares.

The probe is the benchmark's all-reduce section (`tfdist.probe.allreduce`) at a few small sizes
on 2 processes of this machine: each backend's all-reduce time ``t(n)`` and, in the same
processes, a point-to-point TCP exchange of ``n`` bytes each way. Then:

* ``gamma`` (seconds per byte reduced) is timed here: summing two float32 buffers;
* the TCP exchange gives the raw link: ``t = alpha + n beta`` by least squares;
* each all-reduce backend gives ``t = A + B n``; the ring formula at ``p`` processes,
  ``2(p-1) alpha + n (2(p-1)/p beta + (p-1)/p gamma)``, turns ``A`` and ``B`` into that
  backend's own ``alpha`` and ``beta`` (what its transport achieves, copies included);
* in-graph all-reduces (`tfdist.probe.ingraph`: chains of collectives inside one
  ``tf.function``, on the ``tensor`` strategy's runtime and group) give, per size, one
  collective's seconds without the call's dispatch; the same ring fit turns them into the
  ``in_graph`` link, which prices the collectives a traced step runs back to back (a tensor
  split's activation all-reduces).

`Constants` are cached as JSON beside the machine they were measured on (cores, CPU, versions).

Example:
    >>> link = fit_ring([1e3, 1e6], [2e-4 + 1e3 * 2e-9, 2e-4 + 1e6 * 2e-9], p=2, gamma=0.0)
    >>> round(link.alpha * 1e6), round(link.bandwidth_gbps, 3)
    (100, 0.5)
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfdist.advise.curve import fit_line
from tfdist.advise.model import Link
from tfdist.errors import AdviseError, TfdistError, format_error

__all__ = ["Constants", "fit_ring", "measure_gamma", "probe", "load", "save", "default_path",
           "PROBE_SIZES", "fit_in_graph", "IN_GRAPH_SAMPLES"]

PROBE_SIZES = (16 << 10, 256 << 10, 1 << 20, 4 << 20)
"""Message sizes of the probe (bytes): small enough for seconds, wide enough for a slope."""

IN_GRAPH_SAMPLES = "tf in-graph"
"""The samples' key of the in-graph probe: ``[[bytes, seconds of one collective], ...]``."""


@dataclasses.dataclass(frozen=True)
class Constants:
    """What the advisor knows about the network of one machine (or cluster).

    Attributes:
        p2p: The raw point-to-point link (loopback TCP here).
        backends: All-reduce backend (``"tf"``, ``"horovod"``) -> its fitted link.
        gamma: Seconds per byte reduced.
        processes: Processes the probe ran on.
        machine: Where and when it was measured (`tfdist.probe.machine.machine`).
        samples: The raw probe: ``{"tcp"|backend|"tf in-graph": [[bytes, seconds], ...]}``.
        in_graph: Backend -> its link for collectives inside a traced step (``"tf"``: the
            collective runtime the ``tensor`` strategy uses). Empty in constants measured
            before that probe existed (`in_graph_link` is then None).
        overheads: Keras flavour (``"keras3"``, ``"tf_keras"``) -> layout label
            (``"multi_worker x2"``) -> ``(base, per_weight, helper_cores)``: the seconds per
            step that layout costs beyond what the formulas price, ``base + per_weight x``
            the model's weight tensors, from two null models' steps measured under it less
            their predictions; and the cores each of its processes' helper threads keep busy
            (Horovod's background loop), measured while it sleeps
            (`tfdist.bench.advise.measure_overheads`). Empty: none measured.
    """

    p2p: Link
    backends: Mapping[str, Link]
    gamma: float
    processes: int
    machine: Mapping[str, Any]
    samples: Mapping[str, Sequence[Sequence[float]]]
    in_graph: Mapping[str, Link] = dataclasses.field(default_factory=dict)
    overheads: Mapping[str, Mapping[str, tuple[float, ...]]] = dataclasses.field(
        default_factory=dict)

    def overheads_of(self, flavour: str) -> Mapping[str, tuple[float, ...]]:
        """Layout label -> its measured ``(base, per_weight, helper_cores)`` under Keras
        ``flavour`` (empty: none measured)."""
        return self.overheads.get(flavour, {})

    def in_graph_link(self, backend: str = "tf") -> Link | None:
        """The in-graph link of ``backend``; None where the constants have none (older files)."""
        return self.in_graph.get(backend)

    def link(self, backend: str) -> Link:
        """The link of ``backend``, else the raw link (a backend the probe did not run)."""
        return self.backends.get(backend, self.p2p)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Constants:
        return cls(p2p=Link(**data["p2p"]),
                   backends={k: Link(**v) for k, v in data["backends"].items()},
                   gamma=float(data["gamma"]), processes=int(data["processes"]),
                   machine=dict(data["machine"]), samples=dict(data["samples"]),
                   in_graph={k: Link(**v) for k, v in data.get("in_graph", {}).items()},
                   overheads={flavour: {label: tuple(pair) for label, pair in v.items()}
                              for flavour, v in data.get("overheads", {}).items()})


def fit_ring(sizes: Sequence[float], seconds: Sequence[float], p: int, gamma: float) -> Link:
    """A backend's link from its ring all-reduce times at ``p`` processes (least squares).

    Example:
        >>> round(fit_ring([0, 1e6], [4e-4, 4e-4 + 1e-3], p=2, gamma=0.0).alpha, 9)
        0.0002
    """
    line = fit_line(sizes, seconds)
    share = (p - 1) / p
    alpha = max(0.0, line.c0) / (2 * (p - 1))
    beta = max(1e-15, (line.c1 - share * gamma) / (2 * share))
    return Link(alpha=alpha, beta=beta, gamma=gamma)


def measure_gamma(nbytes: int = 8 << 20, repeats: int = 5) -> float:
    """Seconds per byte of summing two float32 buffers here (median of ``repeats``).

    Example:
        >>> 0 < measure_gamma(1 << 16, repeats=2) < 1e-6
        True
    """
    a = np.ones(nbytes // 4, np.float32)
    b = np.ones_like(a)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.add(a, b, out=a)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) / nbytes


def _samples(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[list[float]]]:
    out: dict[str, list[list[float]]] = {}
    for row in rows:
        out.setdefault(row["backend"], []).append([row["bytes"], row["time_ms"] / 1e3])
        tcp = row["bytes"] / (row["limit_GBps"] * 1e9)
        out.setdefault("tcp", []).append([row["bytes"], tcp])
    return out


def _run_allreduce(backends: Sequence[str], p: int, sizes: Sequence[int], repeats: int,
                   timeout: float, log: Any) -> list[dict[str, Any]]:
    from tfdist.probe import allreduce

    rows: list[dict[str, Any]] = []
    for backend in backends:
        config = allreduce.AllreduceConfig(np=p, sizes=list(sizes), warmup=1, repeats=repeats,
                                           backends=(backend,), timeout=timeout)
        try:
            rows += allreduce.run(config, log)["rows"]
        except (TfdistError, RuntimeError, OSError) as err:
            raise AdviseError(format_error(
                f"The network probe ({backend} all-reduce on {p} local processes) failed: {err}",
                received=f"backend={backend}, sizes={list(sizes)}",
                expected="a 2-process job that finishes within the timeout",
                fix="check that loopback ports are free and nothing else loads the machine, "
                f"raise --probe-timeout (now {timeout:g} s), or leave out the backend "
                "(--backends tf)")) from err
    return rows


def _run_in_graph(p: int, repeats: int, timeout: float, env: Mapping[str, str] | None,
                  log: Any) -> list[tuple[int, float]]:
    from tfdist.probe import ingraph

    try:
        return ingraph.run(p, repeats=repeats, env=env, log=log, timeout=timeout)
    except (TfdistError, RuntimeError, OSError) as err:
        raise AdviseError(format_error(
            f"The in-graph collective probe (chains of all-reduces on {p} local processes) "
            f"failed: {err}", received=f"sizes={list(ingraph.SIZES)}",
            expected="a 2-process job that finishes within the timeout",
            fix="check that loopback ports are free, or raise --probe-timeout "
            f"(now {timeout:g} s)")) from err


def fit_in_graph(slopes: Sequence[Sequence[float]], p: int, gamma: float) -> Link:
    """The in-graph link from one collective's seconds by size (`tfdist.probe.ingraph`).

    Example:
        >>> link = fit_in_graph([(4096, 1.6e-3), (1 << 20, 3.3e-3)], p=2, gamma=0.0)
        >>> round(link.alpha * 1e3, 2), round(link.bandwidth_gbps, 2)   # 2 alpha + n beta
        (0.8, 0.61)
    """
    return fit_ring(*zip(*slopes, strict=True), p=p, gamma=gamma)


def probe(backends: Sequence[str] = ("tf", "horovod"), p: int = 2,
          sizes: Sequence[int] = PROBE_SIZES, repeats: int = 3, timeout: float = 300.0,
          log: Any = None, env: Mapping[str, str] | None = None) -> Constants:
    """Runs the all-reduce probes on ``p`` local processes and fits the constants.

    A backend that is not installed (Horovod) is left out and the others are kept.

    Raises:
        AdviseError: a probe job failed or timed out (the message names the backend).
    """
    from tfdist.probe.machine import machine

    usable = [b for b in backends if b != "horovod" or _horovod_available()]
    log = log or io.StringIO()
    rows = _run_allreduce(usable, p, sizes, repeats, timeout, log)
    samples = _samples(rows)
    slopes = _run_in_graph(p, max(repeats, 5), timeout, env, log)
    samples[IN_GRAPH_SAMPLES] = [list(s) for s in slopes]
    gamma = measure_gamma()
    tcp = fit_line(*zip(*samples["tcp"], strict=True))
    if tcp.c1 <= 0:
        raise AdviseError(format_error(
            "The network probe could not measure a bandwidth: the larger exchanges were not "
            "slower than the small ones (the machine's other load decided the times).",
            received=f"TCP exchange seconds by size: {samples['tcp']}",
            expected="times that grow with the size",
            fix="run the probe again when the machine is quieter (tfdist-advise --probe-only), "
            "or with larger sizes"))
    # The TCP exchange of n bytes is one step of a 2-rank ring: n each way at once.
    p2p = Link(alpha=max(0.0, tcp.c0), beta=max(1e-15, tcp.c1), gamma=gamma)
    fitted = {b: fit_ring(*zip(*pts, strict=True), p=p, gamma=gamma)
              for b, pts in samples.items() if b not in ("tcp", IN_GRAPH_SAMPLES)}
    return Constants(p2p=p2p, backends=fitted, gamma=gamma, processes=p,
                     machine=machine(), samples=samples,
                     in_graph={"tf": fit_in_graph(slopes, p, gamma)})


def _horovod_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("horovod") is not None


def default_path() -> Path:
    """``$TFDIST_CACHE`` or ``~/.cache/tfdist``, then ``advise/network-<host>.json``."""
    root = Path(os.environ.get("TFDIST_CACHE", Path.home() / ".cache" / "tfdist"))
    return root / "advise" / f"network-{os.uname().nodename}.json"


def save(constants: Constants, path: str | os.PathLike[str]) -> Path:
    """Writes ``constants`` as JSON; returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(constants.to_json(), indent=1) + "\n")
    return target


def load(path: str | os.PathLike[str]) -> Constants:
    """Reads constants written by `save` (or by ``tfdist-advise --probe-only``).

    Raises:
        AdviseError: the file is missing or is not such a file.
    """
    try:
        return Constants.from_json(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise AdviseError(format_error(
            f"Cannot read network constants from {str(path)!r}: {err}.", received=str(path),
            expected="a JSON file written by tfdist-advise --probe-only --constants FILE",
            fix="run the probe again (tfdist-advise --probe-only --constants FILE) or drop "
            "--constants to probe now")) from err
