"""The rows and settings of ``elastic_train.py``, importable without TensorFlow (the test's
reference replays the same steps in NumPy)."""

from __future__ import annotations

import numpy as np

STEPS, COMMIT_EVERY, PER_RANK, FEATURES, OUTPUTS = 120, 5, 4, 3, 2
LR, MOMENTUM, STEP_SECONDS = 0.05, 0.9, 0.1
PACED_STEPS = 20
"""Steps before this one, and every step at size 1, last at least `STEP_SECONDS`: time for the
test to kill rank 1 two steps past the first commit, and for a rank to join before the job ends.
Back at size 2 after that, nothing is left to wait for: the remaining steps run unpaced (a job's
12 s of sleep became about 4)."""


def rows(step: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s rows at ``step``: a step's global batch depends on the step and size only."""
    rng = np.random.default_rng([step, rank])
    x = rng.normal(size=(PER_RANK, FEATURES)).astype("float32")
    y = rng.normal(size=(PER_RANK, OUTPUTS)).astype("float32")
    return x, y
