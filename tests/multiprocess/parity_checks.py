"""Assertions shared by the replica-parity tests (weights as nested lists from the scripts)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

REFERENCE_ATOL = 1e-5
"""float32 tolerance against the single-process reference (measured gap: ~1e-7)."""

CONTROL_MIN_GAP = 1e-2
"""The half-batch control must differ by more than this (measured: > 0.04). The control is
exactly what replica/worker 0 would hold if gradients were NOT all-reduced (it trains on its own
``per_replica`` rows of each global batch), so an unsynchronised run cannot pass
`REFERENCE_ATOL`."""

MIN_TRAVEL = 5e-2
"""Weights must move at least this far from their initial values (measured: > 0.1)."""


def max_gap(a: Sequence[Any], b: Sequence[Any]) -> float:
    pairs = zip(a, b, strict=True)
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in pairs)


def assert_matches_reference(
    weights: Sequence[Any], result: dict[str, Any], initial: Sequence[Any]
) -> None:
    assert max_gap(weights, initial) > MIN_TRAVEL, "training did not move the weights"
    assert max_gap(weights, result["reference"]) <= REFERENCE_ATOL
    assert max_gap(weights, result["half_batch"]) > CONTROL_MIN_GAP
