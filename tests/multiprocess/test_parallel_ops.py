"""`tfdist.parallel`'s ops and mappings between 2 real processes (TF collectives over gRPC):
all-reduce (sum, mean, max), all-gather, reduce-scatter, send/recv and the scatter/gather
mappings' forward and gradient equal numpy's; a broken gradient rule is seen; the mappings
traced once with the length left open serve several lengths (sized keys), and without their
sized keys TensorFlow refuses the second length. One launch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tfdist.cluster import ClusterSpec

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).parent / "scripts" / "parallel_ops.py"


def test_every_op_and_mapping_gives_numpys_numbers(cluster_runner):
    results = cluster_runner(ClusterSpec.local(workers=2), SCRIPT, timeout=180)
    x = [np.arange(8, dtype="float32").reshape(2, 4) * (r + 1) - r for r in range(2)]
    weight = np.arange(8, dtype="float32").reshape(2, 4) + 1
    for rank in range(2):
        got = {k: np.asarray(v) for k, v in results[f"worker:{rank}"].items()}
        np.testing.assert_array_equal(got["sum"], x[0] + x[1])
        np.testing.assert_array_equal(got["mean"], (x[0] + x[1]) / 2)
        np.testing.assert_array_equal(got["max"], np.maximum(x[0], x[1]))
        np.testing.assert_array_equal(got["gather"], np.concatenate(x, axis=1))
        np.testing.assert_array_equal(got["scatter"], (x[0] + x[1])[:, 2 * rank:2 * rank + 2])
        np.testing.assert_array_equal(got["whole"], np.concatenate([x[0][:, :2], x[1][:, 2:]], 1))
        np.testing.assert_array_equal(got["grad"], weight)  # x replicated: d sum(w * x) = w
        assert np.abs(got["sabotaged_grad"] - weight).max() >= 2.0  # the slices swapped
    np.testing.assert_array_equal(results["worker:1"]["received"], x[0])
    check_open_lengths(results)


def check_open_lengths(results):
    """The mappings traced once with the length left open served two lengths and uneven
    gathers; with one key for every length TensorFlow refused the second."""
    for rank in range(2):
        got = results[f"worker:{rank}"]["open"]
        for rows in (2, 3):
            x = np.arange(4 * rows, dtype="float32").reshape(rows, 4)
            np.testing.assert_array_equal(got[f"sum_{rows}"], x + 2 * x)
            np.testing.assert_array_equal(got[f"max_{rows}"], -x)
        assert got["traces"] == [1, 1]
        np.testing.assert_array_equal(got["uneven_gather"], [[1.0] * 4] * 2 + [[2.0] * 4] * 3)
        refused = results[f"worker:{rank}"]["one_key"]
        print(f"rank {rank}, one key for two lengths: {refused}")
        assert "shape" in refused.lower(), refused
