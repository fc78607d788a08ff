"""All pipeline stages in one process, each on its own logical CPU: ``fit`` with K=2 (GPipe) and
K=3 (1F1B), M=4, ends with the weights of the whole model trained in one process, in both
Kerases (evaluate, predict and the saved model too); so does a fit with sample weights (its
weighted metric equals Keras's, its unweighted one too), and fits whose layers carry weight and
activity regularizers on both stages (weights, logged loss and evaluate equal Keras's; dropping
stage 1's regularization breaks both); stage k's variables and optimizer slots
live on device k (building them inside the strategy's scope is refused); zeroing the gradients
the stages hand back breaks parity.

The script runs in a fresh interpreter: logical CPUs must be configured before TensorFlow starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from parity_checks import max_gap

from tfdist.testing import RESULT_DIR_ENV

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPTS = Path(__file__).parent / "scripts"
REPO = Path(__file__).resolve().parents[2]
PARITY_ATOL = 1e-5
"""float32 tolerance against the whole model in one process (measured gap: 6e-8)."""
SABOTAGE_MIN_GAP = 1e-2
"""Zeroed gradient hand-overs must miss the reference by more (measured: 0.06)."""
DROPPED_MIN_GAP = 1e-2
"""Dropping stage 1's regularization must miss the reference by more (measured: 0.044)."""
PARITY = ["2:4:gpipe", "3:4:1f1b:weighted:regularize", "2:4:1f1b:regularize:scoped"]
CASES = [*PARITY, "2:4:gpipe:sabotage", "2:4:1f1b:regularize:drop"]


def run_cases(tmp_path: Path, flavour: str) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{SCRIPTS}",
           RESULT_DIR_ENV: str(tmp_path)}
    env.pop("TF_CONFIG", None)
    if flavour == "tf_keras":
        env["TF_USE_LEGACY_KERAS"] = "1"
    done = subprocess.run([sys.executable, str(SCRIPTS / "pipeline_devices.py"), str(tmp_path),
                           *CASES],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "chief_0.json").read_text())
    assert result["flavour"] == flavour
    assert result["error_in_scope"].startswith("Stage 1's variables are not on its device.")
    assert "outside any strategy.scope()" in result["error_in_scope"]
    return result["cases"]


def device_index(name: str) -> int:
    assert "/device:CPU:" in name, name
    return int(name.rsplit(":", 1)[1])


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_stages_on_the_devices_of_one_process_match_one_device(tmp_path, flavour):
    cases = run_cases(tmp_path, flavour)
    for case in PARITY:
        got = cases[case]
        stages = int(case[0])
        assert got["describe"].startswith(f"pipeline: {stages} stages on /device:CPU:0, ")
        assert max_gap(got["trained"], got["initial"]) > 0.05, "training did not move weights"
        assert max_gap(got["trained"], got["reference"]) <= PARITY_ATOL
        assert max_gap(got["predict"], got["reference_predict"]) <= PARITY_ATOL
        assert sorted(got["evaluate"]) == ["loss", "mae", "weighted_mae"]
        for name, value in got["reference_evaluate"].items():
            np.testing.assert_allclose(got["evaluate"][name], value, rtol=1e-5, err_msg=name)
        assert max_gap(got["reloaded"], got["trained"]) == 0.0  # saved whole, loads on one device
        for name, values in got["reference_history"].items():
            np.testing.assert_allclose(got["history"][name], values, rtol=1e-5, err_msg=name)
        # Stage k's variables live on device k only, and so do their momentum slots.
        assert [[device_index(d) for d in ds] for ds in got["variable_devices"]] == [
            [k] for k in range(stages)]
        slots = sorted(device_index(d) for d in got["slot_devices"])
        assert set(slots) == set(range(stages)) and len(slots) == 12
        assert got["layers"] == ["d0", "d1", "d2", "d3", "d4", "out"]
        loss_gap = np.max(np.abs(np.subtract(got["history"]["loss"],
                                             got["reference_history"]["loss"])))
        assert loss_gap <= PARITY_ATOL, (case, loss_gap)
    weighted = cases["3:4:1f1b:weighted:regularize"]["history"]
    # The weights weigh the loss and weighted_metrics only (as in Keras), and they matter.
    assert abs(weighted["weighted_mae"][0] - weighted["mae"][0]) > 1e-2
    sabotaged = cases["2:4:gpipe:sabotage"]
    assert max_gap(sabotaged["trained"], sabotaged["reference"]) > SABOTAGE_MIN_GAP
    # The same checks fail when stage 1's regularization losses are dropped.
    dropped = cases["2:4:1f1b:regularize:drop"]
    assert max_gap(dropped["trained"], dropped["reference"]) > DROPPED_MIN_GAP
    loss_gap = np.max(np.abs(np.subtract(dropped["history"]["loss"],
                                         dropped["reference_history"]["loss"])))
    assert loss_gap > 10 * PARITY_ATOL, loss_gap
