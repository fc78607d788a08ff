"""The exit guard of `tfdist.startup_hook`: a parameter-server coordinator's daemon threads are
stopped and joined before the interpreter finalizes (one process holding a whole in-process
cluster, about 6 CPU-s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "coordinator_exit.py"


def test_the_exit_guard_stops_and_joins_every_coordinator_thread():
    out = subprocess.run([sys.executable, str(SCRIPT)], env={**os.environ, "PYTHONPATH": str(REPO)},
                         text=True, capture_output=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["before"] == ["WorkerClosureProcessingLoop-0", "WorkerPreemptionHandler"]
    assert found["left"] == [] and found["after"] == []


def test_import_tfdist_registers_the_guard():
    code = ("import atexit, tfdist, tfdist.startup_hook as h; "
            "print(h._exit_guarded, h.stop_coordinator_threads())")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                         text=True, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True", "[]"]
