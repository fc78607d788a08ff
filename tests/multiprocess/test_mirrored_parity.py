"""Mirrored on 2 logical CPU devices (in a child process): replicas stay identical and equal a
single-process reference trained on the same global batches. Both Keras flavours."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from parity_checks import assert_matches_reference

from tfdist.testing import run_tasks

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).parent / "scripts" / "mirrored_parity.py"
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_mirrored_replicas_match_reference(flavour):
    env = {"PYTHONPATH": str(REPO)}
    if flavour == "tf_keras":
        env["TF_USE_LEGACY_KERAS"] = "1"
    results = run_tasks({"chief:0": [sys.executable, str(SCRIPT)]}, env={"chief:0": env},
                        timeout=90)
    result = results["chief:0"]
    assert result["flavour"] == flavour
    assert result["num_replicas"] == 2
    assert result["variable_types"] == ["MirroredVariable"]
    replicas = result["replicas"]  # [variable][replica]
    assert len(replicas) == 4 and all(len(per_var) == 2 for per_var in replicas)
    for per_var in replicas:  # the same all-reduced update is applied on both: bit-identical
        np.testing.assert_array_equal(per_var[0], per_var[1])
    assert_matches_reference([per_var[0] for per_var in replicas], result, result["initial"])
