"""The census of the processes the tests start (``sitecustomize.py`` and the warm servers of
``warm_start.py`` write it: a line per start, per normal exit, per reaped warm task, per server's
settings and end), summed up for the end of a run."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any


def process_census(path: str, top: int) -> str:
    """Lines on the processes the tests started, the warm servers and the ``top`` tests whose
    processes used the most CPU, or '' (no census)."""
    try:
        lines = Path(path).read_text().splitlines()
        if path.endswith(f"tfdist-census-{os.getpid()}.jsonl"):  # ours; one set by hand stays
            Path(path).unlink()
    except OSError:
        return ""
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    starts = sum(r["kind"] == "start" for r in records)
    warm = sum(r["kind"] == "start" and bool(r.get("warm")) for r in records)
    exits = [r for r in records if r["kind"] == "exit"]
    with_tf = sorted(r["cpu"] for r in exits if r["tensorflow"])
    if not starts:
        return ""
    median = with_tf[len(with_tf) // 2] if with_tf else 0.0
    lines = [f"processes the tests started: {starts} ({warm} forked warm, tests/warm_start.py), "
             f"{starts - len(exits)} of them ended by a "
             f"signal or os._exit; of the {len(exits)} that exited normally, {len(with_tf)} had "
             f"imported TensorFlow ({sum(with_tf):.0f} CPU-s in all, median {median:.1f} each)"]
    servers = warm_servers(records)
    if servers:
        lines.append(servers)
    by_test = cpu_by_test(records)
    if by_test:
        lines.append(f"the {top} tests whose processes used the most CPU (by the test that "
                     "started them; warm tasks however they ended, others at a normal exit):")
        lines += [f"{cpu:8.1f} CPU-s  {test}" for test, cpu in by_test[:top]]
    return "\n".join(lines)


def warm_servers(records: list[dict[str, Any]]) -> str:
    """One line on the warm servers (tests/warm_start.py): how many started for how many sets
    of settings, and how they ended (a server that logged no end was killed)."""
    sockets = [r["argv"][-1] for r in records if r["kind"] == "start"
               and r["argv"][-2:-1] == ["serve"] and r["argv"][-1].endswith(".sock")]
    if not sockets:
        return ""
    ends = Counter(r["why"] for r in records if r["kind"] == "server_end")
    ends["killed or still running"] = len(sockets) - sum(ends.values())
    how = ", ".join(f"{why} {count}" for why, count in ends.most_common() if count)
    return (f"warm servers: {len(sockets)} started for {len(set(sockets))} sets of settings; "
            f"ended: {how}")


def cpu_by_test(records: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """(test, CPU-s of its processes), most first; a process counts for the test running when
    it started (``PYTEST_CURRENT_TEST``; a warm server for the test that first needed it)."""
    test_of = {r["pid"]: r.get("test", "").rsplit(" (", 1)[0]
               for r in records if r["kind"] == "start"}
    by_pid = {r["pid"]: r["cpu"] for r in records if r["kind"] == "reaped"}  # warm tasks
    by_pid |= {r["pid"]: r["cpu"] for r in records if r["kind"] == "exit"}  # ... or their own
    cpu: defaultdict[str, float] = defaultdict(float)
    for pid, seconds in by_pid.items():
        if test_of.get(pid):
            cpu[test_of[pid]] += seconds
    return sorted(cpu.items(), key=lambda item: -item[1])


def main(argv: list[str]) -> int:
    """``python tests/census.py FILE [TOP]``: the summary of a kept census (a run with
    ``TFDIST_TEST_PROCESS_LOG=FILE`` set by hand), every test's row unless ``TOP`` is given."""
    if len(argv) not in (1, 2) or (len(argv) == 2 and not argv[1].isdigit()):
        print("usage: python tests/census.py CENSUS.jsonl [TOP]; received: "
              f"{' '.join(argv) or '(nothing)'}", file=sys.stderr)
        return 2
    top = int(argv[1]) if len(argv) == 2 else 1_000_000
    summary = process_census(argv[0], top)
    print(summary or f"no census in {argv[0]}: it is missing or starts no process")
    return 0 if summary else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
