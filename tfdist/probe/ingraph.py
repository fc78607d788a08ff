"""In-graph all-reduces: what one collective costs inside a traced step, dispatch left out.

The network probe (`tfdist.probe.allreduce`) times one all-reduce per ``tf.function`` call: the
call's dispatch, the collective and the wait for its result. A tensor-parallel step runs its
activation all-reduces inside one graph, back to back, and pays the dispatch once per step (in
the step's own time). This probe runs `ingraph_worker` on ``np`` processes of this machine
(the ``tensor`` strategy's collective runtime and group) and times chains of ``N`` dependent
all-reduces per call for a few ``N``: per size, the least-squares slope of seconds in ``N`` is
one in-graph all-reduce (`chain_slopes`); the intercept is the call's overhead.

Example:
    >>> ranks = {"worker:0": {"seconds": {"1024": {"1": [0.004, 0.004], "9": [0.011, 0.012]}}},
    ...          "worker:1": {"seconds": {"1024": {"1": [0.004, 0.002], "9": [0.012, 0.011]}}}}
    >>> [(n, round(s * 1e3, 4)) for n, s in chain_slopes(ranks)]   # slowest rank: (12 - 4) ms / 8
    [(1024, 1.0)]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from tfdist.cluster import ClusterSpec
from tfdist.probe import jobs
from tfdist.probe.common import median

__all__ = ["SIZES", "COUNTS", "run", "chain_slopes"]

_WORKER = Path(__file__).resolve().parent / "ingraph_worker.py"

SIZES = (4 << 10, 64 << 10, 256 << 10, 1 << 20)
"""Bytes per all-reduce: the range of a tensor step's activations (a token's numbers to a
block's output)."""

COUNTS = (1, 4, 12)
"""All-reduces per call: three points for the slope."""


def chain_slopes(ranks: Mapping[str, Any]) -> list[tuple[int, float]]:
    """Per size, seconds of one in-graph all-reduce: the slope in ``N`` of the per-call time
    (per repeat the slowest rank, then the median over repeats), by least squares."""
    per_rank = [r["seconds"] for r in ranks.values()]
    out = []
    for size in per_rank[0]:
        counts = sorted(per_rank[0][size], key=int)
        calls = [median([max(v) for v in zip(*(r[size][c] for r in per_rank), strict=True)])
                 for c in counts]
        slope = float(np.polyfit([int(c) for c in counts], calls, 1)[0])
        out.append((int(size), max(slope, 0.0)))
    return out


def run(np_: int = 2, sizes: Sequence[int] = SIZES, counts: Sequence[int] = COUNTS,
        repeats: int = 5, *, env: Mapping[str, str] | None = None, log: IO[str],
        timeout: float = 300.0) -> list[tuple[int, float]]:
    """Runs the chains on ``np_`` local processes; returns ``[(bytes, seconds), ...]``.

    Raises:
        RuntimeError: fewer ranks reported than ran.
    """
    args = ["--sizes", ",".join(map(str, sizes)), "--counts", ",".join(map(str, counts)),
            "--repeats", str(repeats)]
    spec = ClusterSpec.local(workers=np_, host="127.0.0.1")
    ranks = jobs.run_tf(spec, _WORKER, args, env=dict(env or {}), log=log, timeout=timeout)
    if len(ranks) != np_:
        raise RuntimeError(f"in-graph probe: {len(ranks)} of {np_} ranks reported "
                           f"({sorted(ranks)})")
    return chain_slopes(ranks)
