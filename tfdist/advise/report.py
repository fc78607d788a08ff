"""The advisor's ranked table, as text for a terminal and as JSON.

Example:
    >>> print(markdown([{"rank": 1, "candidate": "default x1", "step_ms": 2.0,
    ...                  "samples_per_s": 32000.0, "memory_mb": 1.0, "fits": True,
    ...                  "why": "compute 100%", "command": "python train.py"}]).splitlines()[2])
    | 1 | default x1 | 2.00 | 32000 | 1.0 | yes | compute 100% | `python train.py` |
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tfdist.advise.advisor import Advice

__all__ = ["rows", "markdown", "layer_costs", "to_json", "render"]

_COLUMNS = (("rank", "#", "{}"), ("candidate", "candidate", "{}"),
            ("step_ms", "step ms", "{:.2f}"), ("samples_per_s", "samples/s", "{:.0f}"),
            ("memory_mb", "MB/device", "{:.1f}"), ("fits", "fits", "{}"),
            ("why", "dominating term", "{}"), ("command", "command", "`{}`"))


def rows(advice: Advice) -> list[dict[str, Any]]:
    """One dict per candidate, ranked."""
    return [{"rank": i + 1, "candidate": p.candidate.label, "step_ms": p.step_s * 1e3,
             "samples_per_s": p.samples_per_s, "memory_mb": p.memory_bytes / 1e6,
             "fits": p.fits, "why": p.why(), "command": advice.command(p),
             "terms": {t.kind: t.seconds for t in p.terms}}
            for i, p in enumerate(advice.predictions)]


def markdown(table: Sequence[Mapping[str, Any]]) -> str:
    """A markdown table of `rows`."""
    lines = ["| " + " | ".join(h for _, h, _ in _COLUMNS) + " |",
             "|" + "|".join("---" for _ in _COLUMNS) + "|"]
    for row in table:
        cells = [("yes" if row[k] else "NO") if k == "fits" else f.format(row[k])
                 for k, _, f in _COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def layer_costs(advice: Advice) -> list[float]:
    """Per-layer seconds at the micro-batch of the best pipeline candidate (else the batch):
    what ``PipelineStrategy(layer_costs=...)`` balances its stages by."""
    for p in advice.predictions:
        c = p.candidate
        if c.stages > 1:
            return advice.profile.layer_costs(advice.batch / (c.replicas * c.micro_batches))
    return advice.profile.layer_costs(advice.batch)


def to_json(advice: Advice) -> dict[str, Any]:
    """Everything: the table, the profile, the constants, the cluster."""
    return {"batch": advice.batch, "cluster": vars(advice.cluster) | {
                "host_names": list(advice.cluster.host_names)},
            "rows": rows(advice), "layer_costs": layer_costs(advice),
            "profile": advice.profile.to_json(),
            "constants": advice.constants.to_json()}


def render(advice: Advice) -> str:
    """The table, then the winner's command and the constants it rests on."""
    net = advice.constants
    links = ", ".join(f"{name}: alpha {link.alpha * 1e3:.2f} ms, {link.bandwidth_gbps:.2f} GB/s"
                      for name, link in net.backends.items())
    prof = advice.profile
    return "\n".join([
        markdown(rows(advice)), "",
        f"Run the winner: {advice.command()}",
        f"Model: {len(prof.names)} layers, {prof.total_param_bytes / 1e6:.2f} MB of weights "
        f"({prof.embedding_bytes / 1e6:.2f} MB embeddings), one step at batch {advice.batch}: "
        f"{prof.step.at(advice.batch) * 1e3:.2f} ms on {prof.threads or 'all'} thread(s).",
        f"Network ({net.processes} processes): {links}; raw link alpha "
        f"{net.p2p.alpha * 1e3:.2f} ms, {net.p2p.bandwidth_gbps:.2f} GB/s; reduction "
        f"{net.gamma * 1e9:.3f} ns/byte.",
        *(f"Noise: {line}." for line in net.noise)])
