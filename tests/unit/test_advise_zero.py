"""The advisor's ZeRO layouts on the data axis of a pipeline or tensor layout: offered when a
memory bound is given (``tfdist-advise --memory-per-process``), their memory per process by
stage as tfdist holds it (`tfdist.advise.model.pipeline_zero_memory`), on hand-computed
numbers."""

from __future__ import annotations

import pytest

from tfdist.advise import model
from tfdist.advise.candidates import Candidate, Cluster, candidates
from tfdist.advise.model import Link
from tfdist.advise.predict import predict
from tfdist.advise.profile import Line, ModelProfile

pytestmark = pytest.mark.unit

MB = 1e6


def _profile() -> ModelProfile:
    """Four layers of 12 MB (48 MB), Adam (two slots), tiny activations."""
    return ModelProfile(
        names=("a", "b", "c", "d"), params=(1, 1, 1, 1), param_bytes=(12_000_000,) * 4,
        activation_bytes=(4000, 4000, 4000, 400), forward=(Line(0, 1e-5),) * 4,
        backward=(Line(0, 2e-5),) * 4, step=Line(0.002, 1e-4), optimizer_slots=2,
        embeddings=(), threads=1, batch=64)


def test_zero_layouts_are_offered_under_a_memory_bound_only():
    bounded = [c.label for c in candidates(Cluster(4, device_memory=1e9), 64,
                                           micro_batches=(2,))]
    assert {"pipeline D=2 x K=2 M=2 zero=1", "pipeline D=2 x K=2 M=2 zero=2",
            "pipeline D=2 x K=2 M=2 zero=3"} <= set(bounded)
    assert not [label for label in bounded if "K=4" in label and "zero" in label]  # D=1
    tensor = [c.label for c in candidates(Cluster(4, device_memory=1e9), 64,
                                          micro_batches=(2,), heads=4,
                                          tensor_by={1: "tensor", 2: "pipeline"})]
    assert {"tensor D=2 x T=2 zero=3"} <= set(tensor)
    assert not [label for label in tensor if "K=2 x T=2" in label and "zero" in label]
    free = [c.label for c in candidates(Cluster(4), 64, micro_batches=(2,))]
    assert not [label for label in free if "zero=" in label and "pipeline" in label]


def test_memory_per_process_by_stage_under_each_zero_stage():
    # a stage of 24 MB (two 12 MB layers), Adam, D=2, activations left out:
    # replicated 24 x 4 = 96; stages 1-2: 2 x 24 + 24 x 3 / 2 = 84; stage 3: 24 x 3 / 2 +
    # 24 / 2 + 2 x 12 = 72
    got = [model.pipeline_zero_memory(24 * MB, 2, 0.0, 1, 2, s, 12 * MB) / MB
           for s in range(4)]
    assert got == pytest.approx([96.0, 84.0, 84.0, 72.0])
    link = Link(alpha=1e-4, beta=1e-9)
    found = {}
    for stage in range(4):
        layout = Candidate("pipeline", 4, stages=2, micro_batches=2, zero=stage)
        found[stage] = predict(layout, _profile(), {"tf": link}, Cluster(4), 64)
    memory = [found[s].memory_bytes / MB for s in range(4)]
    assert memory[3] < memory[1] <= memory[0] and memory[1] == memory[2]
    assert memory[0] - memory[3] == pytest.approx(24.0, abs=0.1)  # 96 - 72
    comm = {s: next(t for t in found[s].terms if t.kind == "communication") for s in (0, 3)}
    # 72 MB and each stage's activations: 2 micro-batches in flight of 16 rows x 8,000 B
    # (stage 0) or 4,400 B (stage 1)
    assert "ZeRO stage 3 on the data axis (each layer gathered 2 x 2 times a step), per " \
        "process by stage: 72.26 MB, 72.14 MB" in comm[3].detail
    assert comm[3].seconds > comm[0].seconds  # 2 M gathers and M reduce-scatters per layer


def test_multi_worker_stage_three_is_predicted_layer_by_layer():
    # 48 MB in four 12 MB layers, Adam, D=2: 1/D parts and slots 72, their sums 24, one
    # layer's weights and gradient 24: 120 MB (the whole model gathered at once was 264)
    link = Link(alpha=1e-4, beta=1e-9)
    third = predict(Candidate("multi_worker", 2, zero=3), _profile(), {"tf": link},
                    Cluster(2), 64)
    second = predict(Candidate("multi_worker", 2, zero=2), _profile(), {"tf": link},
                     Cluster(2), 64)
    activations = second.memory_bytes - model.zero_memory(48 * MB, 2, 0.0, 2, 2)
    assert third.memory_bytes - activations == pytest.approx(120 * MB)
    comm = {p.candidate.zero: next(t for t in p.terms if t.kind == "communication")
            for p in (second, third)}
    assert "all-gathered twice" in comm[3].detail
    assert comm[3].seconds > comm[2].seconds
