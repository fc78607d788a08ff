"""What a measurement ran on: cores, CPU model, load, library versions and the date.

Example:
    >>> info = machine()
    >>> "cores" in machine_note(info)
    True
"""

from __future__ import annotations

import datetime
import os
import platform
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["machine", "machine_note"]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """Cores, CPU model, load, versions and the date: what the numbers were measured on."""
    versions = {name: _version(name) for name in
                ("tensorflow", "tensorflow-cpu", "keras", "tf-keras", "horovod", "tfdist")}
    return {"cores": os.cpu_count(), "cpu_model": _cpu_model(),
            "python": platform.python_version(),
            "load_avg_1m": os.getloadavg()[0],
            "versions": {k: v for k, v in versions.items() if v},
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def machine_note(info: Mapping[str, Any]) -> str:
    """One line: ``2 cores, <CPU>, load 2.9, tensorflow 2.21.0, ..., 2026-11-22T...``."""
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    return (f"{info['cores']} cores, {info['cpu_model']}, load {info['load_avg_1m']:.1f}, "
            f"{versions}, {info['date']}")
