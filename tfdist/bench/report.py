"""Results out: the machine note, markdown tables, the JSON file and the bus-bandwidth plot.

Example:
    >>> print(markdown_table([{"a": 1.23456, "b": None}], [("a", "A", "{:.2f}"), ("b", "B", "{}")]))
    | A | B |
    |---|---|
    | 1.23 | - |
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tfdist.probe.machine import machine_note

__all__ = ["markdown_table", "write_json", "plot_allreduce", "TABLES", "tables"]

Column = tuple[str, str, str]  # key, header, format


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    return fmt.format(value)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> str:
    """A GitHub markdown table of ``rows`` (missing or None values print as ``-``)."""
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(k), f) for k, _, f in columns) + " |")
    return "\n".join(lines)


TABLES: dict[str, list[Column]] = {
    "allreduce": [("backend", "backend", "{}"), ("size", "size", "{}"),
                  ("time_ms", "time ms", "{:.2f}"), ("algbw_GBps", "algbw GB/s", "{:.3f}"),
                  ("busbw_GBps", "busbw GB/s", "{:.3f}"),
                  ("limit_GBps", "TCP limit GB/s", "{:.3f}"),
                  ("busbw_over_limit", "busbw/limit", "{:.2f}"),
                  ("copy_GBps", "memory copy GB/s", "{:.2f}")],
    "train": [("strategy", "strategy", "{}"), ("replicas", "N", "{}"), ("variant", "variant", "{}"),
              ("samples_per_s", "samples/s", "{:.0f}"), ("overhead", "overhead vs raw", "{:+.1%}"),
              ("scaling", "scaling eff.", "{:.2f}"), ("scaling_vs_default", "eff. vs default",
                                                      "{:.2f}")],
    "ps": [("mode", "mode", "{}"), ("num_ps", "ps", "{}"), ("workers", "workers", "{}"),
           ("steps_per_execution", "steps/exec", "{}"), ("samples_per_s", "samples/s", "{:.0f}"),
           ("spe_speedup", "speed-up vs spe=1", "{:.2f}")],
    "pipeline": [("mode", "mode", "{}"), ("processes", "processes", "{}"),
                 ("micro_batches", "M", "{}"), ("step_s", "loop step s", "{:.3f}"),
                 ("ideal_s", "bound s", "{:.3f}"), ("bubble", "bubble", "{:.2f}"),
                 ("measured_over_ideal", "measured/bound", "{:.2f}"),
                 ("one_f_one_b_s", "1f1b step s (same job)", "{:.3f}"),
                 ("vs_1f1b", "step / 1f1b step (same rounds)", "{:.2f}"),
                 ("fit_step_s", "fit step s", "{:.3f}"),
                 ("fit_over_loop", "fit/loop", "{:.2f}"),
                 ("fit_call_s", "fit call s (outside steps)", "{:.2f}"),
                 ("speedup_vs_default", "speed-up vs 1 process", "{:.2f}")],
    "tensor": [("mode", "mode", "{}"), ("processes", "processes", "{}"),
               ("step_s", "fit step s", "{:.3f}"), ("allreduce_s", "all-reduce s", "{:.4f}"),
               ("bound_s", "bound s", "{:.3f}"),
               ("measured_over_bound", "measured/bound", "{:.2f}"),
               ("weight_bytes", "weight B/process", "{:,}"),
               ("planned_bytes", "planned B", "{:,}"),
               ("speedup_vs_default", "speed-up vs 1 process", "{:.2f}"),
               ("error", "error", "{}")],
    "zero": [("stage", "ZeRO stage", "{}"), ("step_s", "fit step s", "{:.3f}"),
             ("step_over_replicated", "step / stage 0", "{:.2f}"),
             ("weights", "weights B", "{:,}"), ("pieces", "parts B", "{:,}"),
             ("slots", "optimizer B", "{:,}"), ("held", "held B/process", "{:,}"),
             ("sent", "sent B/step", "{:,}"),
             ("sent_over_replicated", "sent / all-reduce", "{:.2f}"), ("bound", "bound", "{}"),
             ("error", "error", "{}")],
    "advise": [("example", "example", "{}"), ("candidate", "candidate", "{}"),
               ("predicted_rank", "predicted rank", "{}"), ("measured_rank", "measured rank", "{}"),
               ("predicted_ms", "predicted ms", "{:.1f}"), ("measured_ms", "measured ms", "{:.1f}"),
               ("error", "error", "{:+.0%}"),
               ("at_profile_ms", "predicted at profile ms", "{:.1f}"),
               ("at_profile_error", "error at profile", "{:+.0%}"),
               ("load", "load", "{:.1f}"), ("reference_ms", "reference step ms", "{:.1f}"),
               ("speed", "speed", "{:.2f}"),
               ("cores", "cores", "{:.2f}"), ("why", "dominating term (predicted)", "{}")],
}
SUBTABLES: dict[tuple[str, str], list[Column]] = {
    ("pipeline", "memory"): [("mode", "peak memory fit adds", "{}"), ("micro_batches", "M", "{}"),
                             ("per_stage", "MB (per stage)", "{}")],
}
"""Further tables of a section: ``(section, key) -> columns`` of ``result[section][key]``."""


def tables(result: Mapping[str, Any]) -> str:
    """Markdown for every section in ``result``, headed by the machine note."""
    parts = [f"Machine: {machine_note(result['machine'])}"]
    for section, columns in TABLES.items():
        if section in result:
            parts.append(f"\n### {section}\n\n{markdown_table(result[section]['rows'], columns)}")
            if result[section].get("note"):
                parts.append(f"\n{result[section]['note']}")
            for (owner, key), more in SUBTABLES.items():
                if owner == section and result[section].get(key):
                    parts.append(f"\n{markdown_table(result[section][key], more)}")
    return "\n".join(parts)


def write_json(result: Mapping[str, Any], out_dir: Path, stem: str) -> Path:
    """Writes ``<out_dir>/<stem>.json`` and returns its path."""
    path = out_dir / f"{stem}.json"
    path.write_text(json.dumps(result, indent=1, sort_keys=True))
    return path


def plot_allreduce(section: Mapping[str, Any], out_dir: Path, stem: str,
                   note: str = "") -> Path | None:
    """busbw vs message size (log-x), one line per backend, the TCP limit dashed; None without
    matplotlib (``pip install tfdist[bench]``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    backends = sorted({r["backend"] for r in section["rows"]})
    for backend in backends:
        rows = [r for r in section["rows"] if r["backend"] == backend]
        line, = ax.plot([r["bytes"] for r in rows], [r["busbw_GBps"] for r in rows], "o-",
                        label=f"{backend} busbw")
        ax.plot([r["bytes"] for r in rows], [r["limit_GBps"] for r in rows], "--",
                color=line.get_color(), alpha=0.6, label=f"TCP ring limit ({backend} job)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"all-reduce, {section['np']} processes\n{note}", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    path = out_dir / f"{stem}_allreduce.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
