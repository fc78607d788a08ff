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

On a busy machine the other load can decide the times: a larger exchange is not slower than a
small one, and a least-squares slope is zero or negative. Such a fit is not a bandwidth (clamped,
it once read 1,000,000 GB/s and ranked Horovod first); the probe then bounds the link by the
largest size's time instead (all of it taken as transfer) and says so in `Constants.noise`,
which the reports print, rather than failing. A cached link faster than `IMPLAUSIBLE_GBPS`
is refitted from its stored samples when read.

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

from tfdist.advise.curve import Line, fit_line
from tfdist.advise.model import Link
from tfdist.errors import AdviseError, TfdistError, format_error

__all__ = ["Constants", "fit_ring", "fit_ring_noted", "fit_constants", "measure_gamma", "probe",
           "load", "save", "default_path", "PROBE_SIZES", "fit_in_graph", "IN_GRAPH_SAMPLES",
           "IMPLAUSIBLE_GBPS"]

PROBE_SIZES = (16 << 10, 256 << 10, 1 << 20, 4 << 20)
"""Message sizes of the probe (bytes): small enough for seconds, wide enough for a slope."""

IN_GRAPH_SAMPLES = "tf in-graph"
"""The samples' key of the in-graph probe: ``[[bytes, seconds of one collective], ...]``."""

IMPLAUSIBLE_GBPS = 1000.0
"""A fitted link faster than this (GB/s) is a noise-dominated fit, not a measurement."""


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
        noise: What the probe could not fit because the machine's load decided its times
            (each a sentence; the link named was bounded instead). Empty: a clean probe.
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
    noise: tuple[str, ...] = ()

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
        """Constants from their JSON; a backend's link faster than `IMPLAUSIBLE_GBPS` (a
        noise-dominated fit of an older probe) is refitted from its samples, or dropped
        (`link` then gives the raw link) when they cannot give one."""
        samples = dict(data["samples"])
        gamma, processes = float(data["gamma"]), int(data["processes"])
        noise = list(data.get("noise", ()))
        backends = {}
        for name, fields in data["backends"].items():
            link = Link(**fields)
            if link.bandwidth_gbps > IMPLAUSIBLE_GBPS:
                refit = _refit(samples.get(name, ()), processes, gamma)
                noise.append(f"the cached {name} link ({link.bandwidth_gbps:.3g} GB/s) was not "
                             "a measurement: " + ("refitted from its samples" if refit else
                                                  "dropped (no samples to refit it from)"))
                if refit is None:
                    continue
                link = refit
            backends[name] = link
        return cls(p2p=Link(**data["p2p"]), backends=backends, gamma=gamma,
                   processes=processes, machine=dict(data["machine"]), samples=samples,
                   in_graph={k: Link(**v) for k, v in data.get("in_graph", {}).items()},
                   overheads={flavour: {label: tuple(pair) for label, pair in v.items()}
                              for flavour, v in data.get("overheads", {}).items()},
                   noise=tuple(noise))


def _refit(points: Sequence[Sequence[float]], p: int, gamma: float) -> Link | None:
    """A backend's link from its stored samples; None without two distinct sizes."""
    if len({point[0] for point in points}) < 2:
        return None
    return fit_ring(*zip(*points, strict=True), p=p, gamma=gamma)


def _bounded_line(sizes: Sequence[float], seconds: Sequence[float]) -> tuple[Line, bool]:
    """The least-squares line of ``seconds`` by ``sizes``; where its slope is not positive (the
    machine's load decided the times), the bound the largest size gives (all of its median
    time taken as transfer, no latency) and True.

    Example:
        >>> line, noisy = _bounded_line([1e3, 1e6], [2e-3, 1e-3])   # larger, yet faster
        >>> line.c0, line.c1, noisy
        (0.0, 1e-09, True)
    """
    line = fit_line(sizes, seconds)
    if line.c1 > 0:
        return line, False
    largest = max(sizes)
    at = [t for n, t in zip(sizes, seconds, strict=True) if n == largest]
    return Line(0.0, float(np.median(at)) / largest), True


def fit_ring(sizes: Sequence[float], seconds: Sequence[float], p: int, gamma: float) -> Link:
    """A backend's link from its ring all-reduce times at ``p`` processes (least squares;
    bounded where the times do not grow with the size: `fit_ring_noted`).

    Example:
        >>> round(fit_ring([0, 1e6], [4e-4, 4e-4 + 1e-3], p=2, gamma=0.0).alpha, 9)
        0.0002
        >>> fit_ring([1e3, 1e6], [3e-3, 1e-3], p=2, gamma=0.0).bandwidth_gbps  # noise: bounded
        1.0
    """
    return fit_ring_noted(sizes, seconds, p, gamma)[0]


def fit_ring_noted(sizes: Sequence[float], seconds: Sequence[float], p: int,
                   gamma: float) -> tuple[Link, bool]:
    """`fit_ring`'s link, and whether it is a bound rather than a fit: the times did not grow
    with the size, or grew less than reducing the bytes alone takes (the slope then is
    shared half and half between sending and reducing)."""
    line, noisy = _bounded_line(sizes, seconds)
    share = (p - 1) / p
    per_byte = line.c1 - share * gamma
    if per_byte <= 0:
        per_byte, noisy = line.c1 / 2, True
    alpha = max(0.0, line.c0) / (2 * (p - 1))
    return Link(alpha=alpha, beta=per_byte / (2 * share), gamma=gamma), noisy


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
    return fit_constants(samples, p, measure_gamma(), machine())


_NOISY = ("the {what} times did not grow with the size (the machine's other load decided them): "
          "its link is bounded by the largest size's time, not fitted")


def fit_constants(samples: Mapping[str, Sequence[Sequence[float]]], p: int, gamma: float,
                  machine: Mapping[str, Any]) -> Constants:
    """The constants from a probe's samples (``"tcp"``, each backend, `IN_GRAPH_SAMPLES`);
    whatever the load made unfit is bounded and named in ``noise``, never refused.

    Example:
        >>> noisy = fit_constants({"tcp": [[1e3, 2e-3], [1e6, 1e-3]],
        ...                        "tf": [[1e3, 4e-3], [1e6, 3e-3]]}, 2, 0.0, {})
        >>> round(noisy.p2p.bandwidth_gbps, 3), round(noisy.link("tf").bandwidth_gbps, 3)
        (1.0, 0.333)
        >>> len(noisy.noise)
        2
    """
    noise = []
    # The TCP exchange of n bytes is one step of a 2-rank ring: n each way at once.
    tcp, noisy = _bounded_line(*zip(*samples["tcp"], strict=True))
    if noisy:
        noise.append(_NOISY.format(what="TCP exchange"))
    p2p = Link(alpha=max(0.0, tcp.c0), beta=tcp.c1, gamma=gamma)
    fitted, in_graph = {}, {}
    for name, points in samples.items():
        if name == "tcp":
            continue
        link, noisy = fit_ring_noted(*zip(*points, strict=True), p=p, gamma=gamma)
        if noisy:
            noise.append(_NOISY.format(what=f"{name} all-reduce"))
        (in_graph if name == IN_GRAPH_SAMPLES else fitted)[name] = link
    return Constants(p2p=p2p, backends=fitted, gamma=gamma, processes=p, machine=machine,
                     samples=dict(samples), noise=tuple(noise),
                     in_graph={"tf": in_graph[IN_GRAPH_SAMPLES]} if in_graph else {})


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
