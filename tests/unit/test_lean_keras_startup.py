"""The suite's start-up knob (``sitecustomize.py``): Keras 3 without scikit-learn and matplotlib."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import json, sys
import tensorflow, keras
at_import = sorted(m for m in ("sklearn", "matplotlib") if m in sys.modules)
from sklearn.metrics import roc_auc_score  # the examples' own imports still work
import matplotlib.pyplot
print(json.dumps({"at_import": at_import, "auc": roc_auc_score([0, 1], [0.2, 0.9])}))
"""


@pytest.mark.multiprocess
def test_keras_starts_without_sklearn_and_matplotlib_under_the_knob():
    # Without the knob, both are imported by `import keras` when installed (the test extra).
    env = {**os.environ, "PYTHONPATH": str(REPO), "TFDIST_TEST_LEAN_KERAS": "1",
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("TF_USE_LEGACY_KERAS", None)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"at_import": [], "auc": 1.0}
