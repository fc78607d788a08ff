"""Predicted step time, samples/s and memory of one candidate, from a profile and constants.

One cost function per kind of layout, chosen through `COSTS` (strategy name -> function); each
returns `Term`s (compute, communication, bubble) that add up to the step, so the report can say
which one dominates and why. A step is one global batch of ``B`` samples: for asynchronous
parameter servers, the time in which the workers together train ``B`` samples.

Compute is the profiled training step at the per-process batch, times the contention when a
host's busy processes want more cores than it has (`model.contention`), over the cluster's
``speed`` (a process's speed now against the profile's, on a machine others share).

Example:
    >>> from tfdist.advise.model import Link
    >>> from tfdist.advise.profile import Line, ModelProfile
    >>> prof = ModelProfile(names=("d",), params=(250_000,), param_bytes=(1_000_000,),
    ...     activation_bytes=(40,), forward=(Line(0, 1e-5),), backward=(Line(0, 2e-5),),
    ...     step=Line(1e-3, 3e-5), optimizer_slots=0, embeddings=(), threads=1, batch=64)
    >>> net = Link(alpha=1e-4, beta=1e-9, gamma=0.0)
    >>> pred = predict(Candidate("multi_worker", 2), prof, {"tf": net}, Cluster(2, cores=2), 64)
    >>> round(pred.step_s * 1e3, 3), pred.dominant.kind
    (3.16, 'compute')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from tfdist.advise import model
from tfdist.advise.candidates import Candidate, Cluster
from tfdist.advise.model import Link
from tfdist.advise.profile import ModelProfile
from tfdist.pipeline.partition import balanced_bounds, stage_costs
from tfdist.pipeline.schedule import schedule_class

__all__ = ["Term", "Prediction", "predict", "rank", "COSTS", "BACKEND_OF", "IN_GRAPH"]

IN_GRAPH = "tf in-graph"
"""The links' key of TF's collectives inside a traced step (`network.Constants.in_graph`):
the tensor split's activation all-reduces, back to back in one graph. Missing (constants from
before that probe): they are priced with the per-call ``"tf"`` link, dispatch included."""

BACKEND_OF: Mapping[str, str] = {"multi_worker": "tf", "horovod": "horovod",
                                 "parameter_server": "tf", "pipeline": "tf", "default": "tf",
                                 "tensor": "tf"}
"""Which probed transport each strategy's traffic uses (TF's gRPC, or Horovod over Gloo)."""

HALVING_DOUBLING: Mapping[str, bool] = {"tf": False, "horovod": False}
"""Whether the backend's CPU all-reduce may use recursive halving-doubling (TF's CPU collectives
and Gloo's default all-reduce are rings; an MPI-built Horovod would be True)."""


@dataclasses.dataclass(frozen=True)
class Term:
    """One part of a step: ``kind`` (compute, communication, bubble), seconds, what it is."""

    kind: str
    seconds: float
    detail: str


@dataclasses.dataclass(frozen=True)
class Prediction:
    """A candidate's predicted step.

    Attributes:
        candidate: The layout.
        terms: The parts of the step; their sum is ``step_s``.
        memory_bytes: The most bytes any one process holds.
        fits: Whether that is within the cluster's ``device_memory``.
        batch: The global batch the step trains.
    """

    candidate: Candidate
    terms: tuple[Term, ...]
    memory_bytes: float
    fits: bool
    batch: int

    @property
    def step_s(self) -> float:
        return sum(t.seconds for t in self.terms)

    @property
    def samples_per_s(self) -> float:
        return self.batch / self.step_s if self.step_s > 0 else float("inf")

    @property
    def dominant(self) -> Term:
        return max(self.terms, key=lambda t: t.seconds)

    def why(self) -> str:
        """``"communication 70%: dense gradients of 48.0 MB over 2.10 GB/s"``."""
        term = self.dominant
        share = 100 * term.seconds / self.step_s if self.step_s else 0.0
        return f"{term.kind} {share:.0f}%: {term.detail}"


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.2f} MB"


def _compute(prof: ModelProfile, batch: float, busy: int, cluster: Cluster) -> Term:
    slow = _slowdown(busy, prof, cluster)
    note = (f", {busy} processes on {cluster.cores:.3g} cores (x{slow:.1f}{_speed_note(cluster)})"
            if slow != 1 else "")
    return Term("compute", prof.step.at(batch) * slow,
                f"forward+backward+update of {batch:g} samples{note}")


def _slowdown(busy: int, prof: ModelProfile, cluster: Cluster) -> float:
    """Compute time over the profile's: contention for the cores, over the speed now."""
    return model.contention(busy, prof.threads or cluster.cores, cluster.cores) / cluster.speed


def _speed_note(cluster: Cluster) -> str:
    return f", speed {cluster.speed:.2f} of the profile's" if cluster.speed != 1 else ""


def _allreduce_s(p: int, nbytes: float, link: Link, backend: str) -> float:
    ring = model.ring_allreduce_s(p, nbytes, link)
    if HALVING_DOUBLING.get(backend, False):
        return min(ring, model.halving_doubling_s(p, nbytes, link))
    return ring


def _dense_bytes(prof: ModelProfile) -> float:
    return prof.total_param_bytes - prof.embedding_bytes


def _sparse_bytes(prof: ModelProfile, batch: float) -> float:
    return sum(e.touched_bytes(int(batch)) for e in prof.embeddings)


def _activations(prof: ModelProfile, batch: float) -> float:
    return sum(prof.activation_bytes) * batch


def _single(c: Candidate, prof: ModelProfile, links: Mapping[str, Link], cluster: Cluster,
            batch: int) -> tuple[list[Term], float]:
    memory = model.data_parallel_memory(prof.total_param_bytes, prof.optimizer_slots,
                                        _activations(prof, batch))
    return [_compute(prof, batch, 1, cluster)], memory


def _allreduce(c: Candidate, prof: ModelProfile, links: Mapping[str, Link], cluster: Cluster,
               batch: int) -> tuple[list[Term], float]:
    backend = BACKEND_OF[c.strategy]
    link, p, local = links[backend], c.processes, batch / c.processes
    dense = _dense_bytes(prof)
    # Embedding gradients are sparse (IndexedSlices): gathered from every replica, not reduced.
    sparse = _sparse_bytes(prof, local)
    gather = (p - 1) * (link.alpha + sparse * link.beta) if sparse else 0.0
    comm = _allreduce_s(p, dense, link, backend) + gather
    detail = (f"dense gradients of {_mb(dense)} over {link.bandwidth_gbps:.2f} GB/s "
              f"({backend} all-reduce, alpha {link.alpha * 1e3:.2f} ms)")
    if sparse:
        detail += f", plus {_mb(sparse)} of embedding rows gathered"
    memory = model.data_parallel_memory(prof.total_param_bytes, prof.optimizer_slots,
                                        _activations(prof, local))
    return [_compute(prof, local, cluster.per_host, cluster),
            Term("communication", comm, detail)], memory


def _zero(c: Candidate, prof: ModelProfile, links: Mapping[str, Link], cluster: Cluster,
          batch: int) -> tuple[list[Term], float]:
    """ZeRO stage ``c.zero`` (`tfdist.zero`): stage 1 all-reduces the dense gradients, stages 2
    and 3 reduce-scatter them (half an all-reduce's traffic); then every stage all-gathers the
    updated weights (the other half: stage 3 gathers each layer for its forward and again for
    its backward instead, a step holding one layer whole at a time)."""
    link, p, local = links["tf"], c.processes, batch / c.processes
    dense, whole = _dense_bytes(prof), prof.total_param_bytes
    sparse = _sparse_bytes(prof, local)
    reduce = _allreduce_s(p, dense, link, "tf") * (1.0 if c.zero == 1 else 0.5)
    gather = 0.5 * _allreduce_s(p, whole, link, "tf") * (2 if c.zero == 3 else 1)
    rows = (p - 1) * (link.alpha + sparse * link.beta) if sparse else 0.0
    detail = (f"ZeRO stage {c.zero}: dense gradients of {_mb(dense)} "
              f"{'all-reduced' if c.zero == 1 else 'reduce-scattered'}, the weights "
              f"({_mb(whole)}) all-gathered"
              + (" twice (each layer's forward and backward)" if c.zero == 3 else "")
              + f", over {link.bandwidth_gbps:.2f} GB/s")
    memory = model.zero_memory(whole, prof.optimizer_slots, _activations(prof, local), p,
                               c.zero, largest_layer_bytes=max(prof.param_bytes, default=0))
    return [_compute(prof, local, cluster.per_host, cluster),
            Term("communication", reduce + gather + rows, detail)], memory


def _parameter_server(c: Candidate, prof: ModelProfile, links: Mapping[str, Link],
                      cluster: Cluster, batch: int) -> tuple[list[Term], float]:
    link, n, k = links["tf"], c.processes, c.ps
    local = batch / n
    dense, sparse = _dense_bytes(prof), _sparse_bytes(prof, local)
    comm = model.ps_traffic_s(dense + sparse, n, k, link)
    detail = (f"each worker pulls and pushes {_mb(dense)} of dense weights"
              + (f" and {_mb(sparse)} of embedding rows" if sparse else "")
              + f" over {link.bandwidth_gbps:.2f} GB/s, {k} ps serving {n} workers")
    worker = model.data_parallel_memory(0, 0, _activations(prof, local)) + dense + sparse
    ps = model.ps_memory(prof.total_param_bytes, prof.optimizer_slots, k)
    return [_compute(prof, local, cluster.per_host, cluster),
            Term("communication", comm, detail)], max(worker, ps)


def _stage_tensor_s(prof: ModelProfile, bounds: Sequence[int], micro: float, tensor: int,
                    link: Link) -> list[float]:
    """Per stage, its activation all-reduces (forward and backward) of one micro-batch."""
    per_stage: list[list[float]] = [[] for _ in bounds[1:]]
    for layer, nbytes in prof.reductions:
        stage = next(s for s in range(len(bounds) - 1) if bounds[s] <= layer < bounds[s + 1])
        per_stage[stage].append(nbytes * micro)
    return [model.tensor_activations_s(tensor, sizes, link) for sizes in per_stage]


def _pipeline(c: Candidate, prof: ModelProfile, links: Mapping[str, Link], cluster: Cluster,
              batch: int) -> tuple[list[Term], float]:
    """K stages (K >= 1) of M micro-batches, each stage's layers split T ways (T >= 1), on
    D = P / (K T) replicas: a pipeline, a tensor layout (K = M = 1), or both."""
    link, k, m, t, d = links["tf"], c.stages, c.micro_batches, c.tensor, c.replicas
    in_graph = links.get(IN_GRAPH, link)
    micro = batch / (d * m)
    scale, rest = _layer_scale(prof, batch / d)
    # one shard's: split layers / T, replicated ones whole
    costs = [cost * scale for cost in prof.layer_costs(micro, t)]
    bounds = balanced_bounds(costs, k)
    slow = _slowdown(cluster.per_host, prof, cluster)
    compute = [cost * slow for cost in stage_costs(costs, bounds)]
    tensor = _stage_tensor_s(prof, bounds, micro, t, in_graph)
    slots = [a + b for a, b in zip(compute, tensor, strict=True)]
    worst = max(range(k), key=slots.__getitem__)
    slowest = slots[worst]
    boundary = max(prof.activation_bytes[b - 1] for b in bounds[1:-1]) * micro if k > 1 else 0.0
    # one inter-op thread: a stage sends and receives after its compute, not beside it
    plan = schedule_class(c.schedule)(k, m)
    _, transfer = model.pipeline_step_s(slowest, k, m, boundary, link,
                                        overlap=prof.inter_op_threads != 1,
                                        idle_slots=plan.idle_slots())
    # What the layers alone miss, shared by the K T processes; fit's loop, each runs whole.
    rest = (rest / (k * t) + prof.loop_s) * slow
    shard_bytes = prof.bytes_per_shard(t)
    params = stage_costs(shard_bytes, bounds)
    sync = model.ring_allreduce_s(d, max(params), link)
    if c.zero == 3:  # each layer gathered twice and reduce-scattered once per micro-batch
        sync *= 1.5 * m
    terms = [Term("compute", m * compute[worst] + rest, _compute_detail(c, micro))]
    if k > 1:
        idle = plan.idle_slots() * slowest  # its slots' transfers: in the communication term
        terms.append(Term("bubble", idle, f"{c.schedule}: {plan.bubble():.0%} of the step idle"
                          f" ({plan.idle_slots():.3g} slots of the slowest stage)"))
    acts = [sum(prof.activation_bytes[a:b]) * micro for a, b in zip(bounds, bounds[1:],
                                                                     strict=False)]
    memories = [model.pipeline_zero_memory(pb, prof.optimizer_slots, act, plan.in_flight(), d,
                                           c.zero, max(shard_bytes[a:b], default=0))
                for pb, act, a, b in zip(params, acts, bounds, bounds[1:], strict=False)]
    detail = _communication_detail(k, m, d, boundary, max(params), link)
    if c.zero:
        detail += (f"; ZeRO stage {c.zero} on the data axis"
                   + (f" (each layer gathered 2 x {m} times a step)" if c.zero == 3 else "")
                   + ", per process by stage: "
                   + ", ".join(f"{_mb(b)}" for b in memories))
    terms.append(Term("communication", transfer + sync, detail))
    if t > 1:
        terms.append(Term("tensor", m * tensor[worst],
                          _tensor_detail(prof, t, micro, in_graph, IN_GRAPH in links)))
    return terms, max(memories)


def _layer_scale(prof: ModelProfile, batch: float) -> tuple[float, float]:
    """(scale of each layer's cost, seconds the layers miss) of a step of ``batch``, fit's
    loop (``loop_s``) left out: the whole step is measured as one (the model's own ``fit``),
    the layers each alone, with their calls' overheads and their own moments of load, so
    they can add up to more than the step. Then they give only the shares of the step
    (scale < 1, nothing missed); else the rest (loss, optimizer update) is what the step has
    beyond them.

    Example:
        >>> from tfdist.advise.profile import Line
        >>> prof = ModelProfile(("a", "b"), (0, 0), (4, 4), (4, 4), (Line(0, 1e-3),) * 2,
        ...                     (Line(0, 2e-3),) * 2, Line(0, 3e-3), 0, (), 1, 8)
        >>> _layer_scale(prof, 10)                   # layers 60 ms, the step 30 ms
        (0.5, 0.0)
    """
    whole, step = sum(prof.layer_costs(batch)), prof.step.at(batch) - prof.loop_s
    if whole <= step or whole <= 0:
        return 1.0, max(0.0, step - whole)
    return max(0.0, step) / whole, 0.0


def _compute_detail(c: Candidate, micro: float) -> str:
    split = f", each layer split {c.tensor} ways" if c.tensor > 1 else ""
    if c.stages == 1:
        return f"forward+backward+update of {micro:g} samples{split}"
    return (f"{c.micro_batches} micro-batches of {micro:g} samples through the slowest of "
            f"{c.stages} stages{split}")


def _communication_detail(k: int, m: int, d: int, boundary: float, params: float,
                          link: Link) -> str:
    sync = f"stage gradients of {_mb(params)} over {d} replicas" if d > 1 else ""
    if k == 1:
        return (f"gradients of {_mb(params)} per shard over {d} replicas"
                if d > 1 else "none between replicas")
    return (f"{2 * (m + k - 1)} transfers of {_mb(boundary)} activations (beyond compute) over "
            f"{link.bandwidth_gbps:.2f} GB/s" + (f", {sync}" if sync else ""))


def _tensor_detail(prof: ModelProfile, t: int, micro: float, link: Link,
                   in_graph: bool) -> str:
    largest = max((n for _, n in prof.reductions), default=0) * micro
    how = "in-graph" if in_graph else "per call (constants without the in-graph probe)"
    return (f"{len(prof.reductions)} all-reduces of activations per step and micro-batch "
            f"(4 per block, the embedding's, the logits') of up to {_mb(largest)} over T={t}, "
            f"{link.bandwidth_gbps:.2f} GB/s, alpha {link.alpha * 1e3:.2f} ms, {how}")


COSTS: Mapping[str, Callable[..., tuple[list[Term], float]]] = {
    "default": _single, "multi_worker": _allreduce, "horovod": _allreduce,
    "parameter_server": _parameter_server, "pipeline": _pipeline, "tensor": _pipeline}
"""Strategy name -> its cost function ``(candidate, profile, links, cluster, batch)``."""


def predict(candidate: Candidate, prof: ModelProfile, links: Mapping[str, Link],
            cluster: Cluster, batch: int,
            overheads: Mapping[str, Sequence[float]] | None = None) -> Prediction:
    """The predicted step of ``candidate`` (``links``: backend name -> fitted link;
    ``overheads``: layout label -> its measured ``(base, per_weight[, helper_cores])``:
    seconds per step beyond the formulas, and the cores each process's helper threads keep
    busy, which the compute then shares the cores with; `network.Constants.overheads`)."""
    base, per_weight, *more = (overheads or {}).get(candidate.label, (0.0, 0.0))
    helper = more[0] if more and candidate.processes > 1 else 0.0
    if helper > 0:  # P processes on C cores, each with helper threads: as if on C / (1 + h)
        cluster = dataclasses.replace(cluster, cores=cluster.cores / (1 + helper))
    split = candidate.stages > 1 or candidate.tensor > 1  # whichever strategy runs it
    cost = _pipeline if split else _zero if candidate.zero else COSTS[candidate.strategy]
    terms, memory = cost(candidate, prof, links, cluster, batch)
    extra = base + per_weight * prof.weight_tensors
    if extra > 0:
        terms.append(Term("overhead", extra / cluster.speed,
                          f"the layout's own cost per step: {base * 1e3:.2f} ms + "
                          f"{per_weight * 1e6:.0f} us x {prof.weight_tensors} weights (null "
                          "models measured under it, beyond the formulas)"
                          + (f"; its helper threads take {helper:.2f} cores a process"
                             if helper > 0 else "")))
    fits = cluster.device_memory is None or memory <= cluster.device_memory
    return Prediction(candidate, tuple(terms), memory, fits, batch)


def rank(predictions: Sequence[Prediction]) -> list[Prediction]:
    """Fitting candidates fastest first, then those that do not fit."""
    return sorted(predictions, key=lambda p: (not p.fits, p.step_s))
