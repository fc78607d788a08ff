"""A model-parallel job (pipeline K=2, tensor T=2; 2 processes) fitting numpy arrays with
Keras's default ``shuffle=True`` and no seed trains as one process does on the permutation that
one process draws from the seed the job agreed (`tfdist.compat.shuffle`): the batch check passes,
the losses (and the pipeline's gathered weights) equal that run's, the global seed is unset
again after ``fit``. Sabotage: a seed per process is stopped at step 1 by the batch check.
Also: a model made and fit outside every strategy's scope before ``build_model`` is refused
(each process would train its own whole model), and the one-process references after it are
not. One
launch of 2 processes per strategy (about 30 s each)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tfdist.cluster import ClusterSpec

pytestmark = pytest.mark.multiprocess

SCRIPT = Path(__file__).parent / "scripts" / "model_parallel_shuffle.py"
PARITY_ATOL = 1e-5
"""float32: the split model against the whole one in one process, on the same batches."""
ENV = {"pipeline": {"TFDIST_PIPELINE_STAGES": "2", "TFDIST_PIPELINE_MICRO_BATCHES": "2"},
       "tensor": {"TFDIST_TENSOR_SHARDS": "2"}}


@pytest.mark.parametrize("strategy", ["pipeline", "tensor"])
def test_an_unseeded_array_fit_shuffles_alike_on_every_process(cluster_runner, strategy):
    env = {"TFDIST_STRATEGY": strategy, **ENV[strategy]}
    results = cluster_runner(ClusterSpec.local(workers=2), SCRIPT, env=env, strategy=strategy,
                             timeout=180)
    chief, other = results["worker:0"], results["worker:1"]
    for result in (chief, other):
        assert result["seed_before"] is None and result["seed_after"] is None, result
    assert chief["seed"] == other["seed"] and chief["seed"] is not None
    assert chief["loss"] == other["loss"]
    print(f"seed {chief['seed']}: loss {chief['loss']} against {chief['reference_loss']} in "
          f"one process (unshuffled: {chief['control_loss']})")
    np.testing.assert_allclose(chief["loss"], chief["reference_loss"], rtol=0, atol=PARITY_ATOL)
    moved = max(abs(c - r) for c, r in zip(chief["control_loss"], chief["reference_loss"],
                                           strict=True))
    assert moved > 100 * PARITY_ATOL, "the unshuffled control trains alike: shuffle untested"
    if strategy == "pipeline":
        for got, want in zip(chief["trained"], chief["reference"], strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=PARITY_ATOL)
    for result in (chief, other):
        assert "do not hold the same global batch" in result["sabotage"], result["sabotage"]
        refused = result["unsplit_fit"]  # before build_model; the chief's references after
        assert f"fit outside every tfdist strategy's scope in a {strategy} job of 2 " \
               "processes" in refused, refused
        assert "Fix: model = strategy.build_model(build_fn)" in refused
        assert "A model meant to train in this process alone (a one-process reference) is " \
               "accepted once strategy.build_model has made the job's model" in refused
