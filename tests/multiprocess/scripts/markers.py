"""Marker files the test scripts leave in a folder the test gives them (one per start)."""

from __future__ import annotations

import os
import time


def wait_for_marker(folder: str, prefix: str, timeout: float = 30.0, count: int = 1) -> bool:
    """Waits until ``count`` files named ``prefix...`` are in ``folder``; whether they came in
    time.

    A warm start can fork worker:1 before worker:0: a script that must fail only once worker:0
    runs (the test counts worker:0's starts) waits for worker:0's marker first.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(name.startswith(prefix) for name in os.listdir(folder)) >= count:
            return True
        time.sleep(0.05)
    return False
