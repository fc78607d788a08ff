"""The cost model: step time and memory of each candidate layout, from measured constants.

Pure functions, no TensorFlow. Times are seconds, sizes bytes. A `Link` is the alpha-beta-gamma
model of one collective implementation: ``alpha`` seconds per message (latency), ``beta`` seconds
per byte moved, ``gamma`` seconds per byte reduced. The formulas are the classic ones (Thakur,
Rabenseifner and Gropp, "Optimization of Collective Communication Operations in MPICH", 2005):

* ring all-reduce: ``2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma``;
* recursive halving-doubling: ``2 lg(p) alpha`` + the same bandwidth and reduction terms;
* parameter servers, k shards, n workers: a worker pulls and pushes its ``M`` bytes, each ps
  serves ``n M / k``: ``2 (k alpha + max(M, n M / k) beta)`` per step;
* pipeline, K stages, M micro-batches: ``M`` + the schedule's idle slots (GPipe and 1F1B:
  ``K - 1``; each schedule's from its simulation, `tfdist.pipeline.schedule`) of the slowest
  stage's forward + backward of one micro-batch, or of its two transfers where those take longer
  (tfdist's engine sends and receives asynchronously, beside the compute; after it where a stage
  has one inter-op thread); idle fraction (bubble) ``(K - 1) / (M + K - 1)`` for GPipe;
* tensor parallelism, T shards (Megatron-LM): each layer's compute / T, plus per forward two
  all-reduces over the T processes of the block's activations (``batch x seq x hidden x 4``
  bytes each) per Transformer block, and two in the backward; each process holds
  ``split / T + replicated`` weight bytes.

Example:
    >>> link = Link(alpha=1e-4, beta=1e-9, gamma=5e-10)
    >>> round(ring_allreduce_s(2, 1e6, link) * 1e3, 3)   # 2a + n b + n g / 2
    1.45
    >>> bubble(4, 12)
    0.2
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from tfdist.pipeline.schedule import schedule_class

__all__ = ["Link", "ring_allreduce_s", "halving_doubling_s", "ps_traffic_s", "bubble",
           "pipeline_step_s", "data_parallel_memory", "ps_memory", "pipeline_memory",
           "contention", "tensor_activations_s", "tensor_weight_bytes", "zero_memory",
           "pipeline_zero_memory"]


@dataclasses.dataclass(frozen=True)
class Link:
    """Alpha-beta-gamma constants of one transport.

    Attributes:
        alpha: Seconds of latency per message.
        beta: Seconds per byte sent (1 / bandwidth).
        gamma: Seconds per byte reduced (summing two float32 buffers).

    Example:
        >>> Link(alpha=1e-4, beta=5e-10, gamma=1e-10).bandwidth_gbps
        2.0
    """

    alpha: float
    beta: float
    gamma: float = 0.0

    @property
    def bandwidth_gbps(self) -> float:
        """``1 / beta`` in GB/s."""
        return 1e-9 / self.beta if self.beta > 0 else math.inf


def ring_allreduce_s(p: int, nbytes: float, link: Link) -> float:
    """Ring all-reduce of ``nbytes`` over ``p`` processes (0 for one process).

    Example:
        >>> link = Link(alpha=1e-3, beta=1e-9, gamma=0.0)
        >>> round(ring_allreduce_s(4, 4e6, link), 6)   # 6 a + 1.5 n b
        0.012
        >>> ring_allreduce_s(1, 4e6, link)
        0.0
    """
    if p <= 1:
        return 0.0
    share = (p - 1) / p
    return 2 * (p - 1) * link.alpha + 2 * share * nbytes * link.beta + share * nbytes * link.gamma


def halving_doubling_s(p: int, nbytes: float, link: Link) -> float:
    """Recursive halving-doubling all-reduce (Rabenseifner): ``2 lg p`` latency steps.

    Example:
        >>> link = Link(alpha=1e-3, beta=1e-9, gamma=0.0)
        >>> round(halving_doubling_s(8, 8e6, link), 6)   # 6 a + 1.75 n b
        0.02
    """
    if p <= 1:
        return 0.0
    share = (p - 1) / p
    return (2 * math.log2(p) * link.alpha + 2 * share * nbytes * link.beta
            + share * nbytes * link.gamma)


def ps_traffic_s(nbytes: float, workers: int, shards: int, link: Link) -> float:
    """One worker's pull and push of ``nbytes`` spread over ``shards`` ps, ``workers`` at once.

    The worker's own link carries ``nbytes`` each way; each ps carries ``workers * nbytes /
    shards``; the slower of the two sets the time.

    Example:
        >>> link = Link(alpha=0.0, beta=1e-9)
        >>> ps_traffic_s(1e6, workers=4, shards=1, link=link)   # the ps is the bottleneck
        0.008
        >>> ps_traffic_s(1e6, workers=4, shards=4, link=link)   # now the worker's link
        0.002
    """
    bottleneck = max(nbytes, workers * nbytes / shards)
    return 2 * (shards * link.alpha + bottleneck * link.beta)


def bubble(stages: int, micro_batches: int, schedule: str = "gpipe") -> float:
    """The idle fraction of a step of ``schedule`` (GPipe: ``(K - 1) / (M + K - 1)``).

    Example:
        >>> bubble(2, 4), round(bubble(2, 4, "zb-h1"), 3)
        (0.2, 0.077)
    """
    return schedule_class(schedule)(stages, micro_batches).bubble()


def pipeline_step_s(slowest_stage_s: float, stages: int, micro_batches: int,
                    boundary_bytes: float, link: Link, overlap: bool = True,
                    idle_slots: float | None = None) -> tuple[float, float]:
    """(step seconds, exposed transfer seconds) of a K-stage pipeline of M micro-batches whose
    schedule leaves ``idle_slots`` (None: GPipe's ``K - 1``) slots idle.

    ``slowest_stage_s`` is the largest stage's forward + backward of one micro-batch;
    ``boundary_bytes`` the largest activation a stage sends per micro-batch (its gradient
    comes back the same size). Transfers overlap the compute (``overlap``): only what they
    take beyond it is exposed; a stage process with one inter-op thread runs them after its
    compute instead (``overlap=False``: all exposed).

    Example:
        >>> step, exposed = pipeline_step_s(0.1, 2, 4, 1e6, Link(alpha=0.0, beta=1e-9))
        >>> round(step, 4), exposed                                # hidden behind compute
        (0.5, 0.0)
        >>> step, exposed = pipeline_step_s(0.001, 2, 4, 1e6, Link(alpha=1e-3, beta=1e-9))
        >>> round(step, 4), round(exposed, 4)                      # 5 slots of 4 ms transfers
        (0.02, 0.015)
        >>> step, exposed = pipeline_step_s(0.1, 2, 4, 1e6, Link(alpha=0.0, beta=1e-9),
        ...                                 overlap=False)
        >>> round(step, 4), round(exposed, 4)                      # 5 slots of 0.1 s + 2 ms
        (0.51, 0.01)
    """
    transfer = 2 * (link.alpha + boundary_bytes * link.beta) if stages > 1 else 0.0
    slots = micro_batches + (stages - 1 if idle_slots is None else idle_slots)
    exposed = max(0.0, transfer - slowest_stage_s) if overlap else transfer
    return slots * (slowest_stage_s + exposed), slots * exposed


def data_parallel_memory(param_bytes: float, optimizer_slots: int,
                         activation_bytes: float) -> float:
    """One replica's bytes: weights, gradients, optimizer slots, activations of its batch.

    Example:
        >>> data_parallel_memory(4e6, optimizer_slots=2, activation_bytes=1e6)
        17000000.0
    """
    return param_bytes * (2 + optimizer_slots) + activation_bytes


def zero_memory(param_bytes: float, optimizer_slots: int, activation_bytes: float,
                processes: int, stage: int, largest_layer_bytes: float | None = None) -> float:
    """One process's peak bytes under ZeRO ``stage`` (0: replicated) as tfdist runs it.

    Between steps a process holds the weights whole (stages 0-2) or 1/D of them (stage 3), and
    for its 1/D part a master copy and the optimizer slots (stages 1-3). During a step: its own
    whole gradients, plus the summed gradients (whole at stages 0-1, 1/D at 2-3), plus at
    stage 3 the whole weights gathered for the step. With ``largest_layer_bytes``, stage 3 as
    `tfdist.zero.layerwise` runs it: one layer gathered at a time (its weights, then its whole
    gradient before the reduce-scatter) besides the 1/D parts, their sums and slots.

    Example:
        >>> [zero_memory(1e6, 2, 0.0, 2, s) / 1e6 for s in range(4)]   # Adam, D=2
        [4.0, 4.5, 4.0, 4.0]
        >>> [zero_memory(1e6, 2, 0.0, 8, s) / 1e6 for s in range(4)]   # Adam, D=8
        [4.0, 3.375, 2.5, 2.5]
        >>> zero_memory(1e6, 2, 0.0, 2, 3, largest_layer_bytes=2e5) / 1e6  # layer by layer
        2.4
    """
    p, d = param_bytes, processes
    if stage == 0:
        return data_parallel_memory(p, optimizer_slots, activation_bytes)
    part = p * (1 + optimizer_slots) / d
    if stage == 3 and largest_layer_bytes is not None:
        return part + p / d + 2 * largest_layer_bytes + activation_bytes
    summed = p if stage == 1 else p / d
    return 2 * p + summed + part + activation_bytes


def ps_memory(param_bytes: float, optimizer_slots: int, shards: int) -> float:
    """One ps's bytes: its shard of the weights and their optimizer slots.

    Example:
        >>> ps_memory(8e6, optimizer_slots=1, shards=2)
        8000000.0
    """
    return param_bytes * (1 + optimizer_slots) / shards


def pipeline_memory(stage_param_bytes: float, optimizer_slots: int,
                    micro_activation_bytes: float, in_flight: int) -> float:
    """One stage's bytes: its weights, gradients and slots, and ``in_flight`` micro-batches'
    activations (GPipe: M; 1F1B: at most K).

    Example:
        >>> pipeline_memory(1e6, optimizer_slots=0, micro_activation_bytes=1e5, in_flight=4)
        2400000.0
    """
    return stage_param_bytes * (2 + optimizer_slots) + micro_activation_bytes * in_flight


def pipeline_zero_memory(stage_param_bytes: float, optimizer_slots: int,
                         micro_activation_bytes: float, in_flight: int, replicas: int,
                         stage: int, largest_layer_bytes: float) -> float:
    """One pipeline stage's (or tensor shard's) process's bytes under ZeRO ``stage`` on its
    data axis of D = ``replicas`` (0: `pipeline_memory`), as tfdist runs it
    (`tfdist.zero.data_axis`, `tfdist.zero.data_axis_layers`).

    Stages 1 and 2 keep the stage's weights and the gradient sums over the micro-batches
    whole, and 1/D of the master copy and slots; stage 3 keeps 1/D of the weights, of their
    sums and of the slots, and gathers one layer at a time (its weights, then in its backward
    its whole gradient before the reduce-scatter: twice ``largest_layer_bytes`` at most).

    Example:
        >>> [pipeline_zero_memory(1e6, 2, 0.0, 1, 2, s, 2e5) / 1e6 for s in range(4)]
        [4.0, 3.5, 3.5, 2.4]
    """
    p, d = stage_param_bytes, replicas
    acts = micro_activation_bytes * in_flight
    if stage == 0:
        return pipeline_memory(p, optimizer_slots, micro_activation_bytes, in_flight)
    part = p * (1 + optimizer_slots) / d
    if stage < 3:
        return 2 * p + part + acts
    return part + p / d + 2 * largest_layer_bytes + acts


def contention(busy_processes: int, threads_each: int, cores: float) -> float:
    """How much slower compute runs when the busy processes want more cores than the host has.

    Example:
        >>> contention(4, 1, cores=2), contention(2, 1, cores=2)
        (2.0, 1.0)
    """
    return max(1.0, busy_processes * threads_each / max(1, cores))


def tensor_activations_s(tensor: int, activation_bytes: Sequence[float], link: Link,
                         allreduce: Callable[[int, float, Link], float] | None = None) -> float:
    """The activation all-reduces of one forward and backward under tensor parallelism:
    each of ``activation_bytes`` (every all-reduce of the step: four per Transformer block,
    two forward and two backward) is all-reduced over the ``tensor`` processes
    (``allreduce``: default `ring_allreduce_s`).

    Example:
        >>> link = Link(alpha=1e-4, beta=1e-9)
        >>> block = [2e6] * 4                       # one block: 2 forward, 2 backward
        >>> round(tensor_activations_s(2, block, link) * 1e3, 3)   # 4 x (2 a + n b)
        8.8
        >>> tensor_activations_s(1, block, link)
        0.0
    """
    reduce = allreduce or ring_allreduce_s
    return sum(reduce(tensor, n, link) for n in activation_bytes)


def tensor_weight_bytes(split_bytes: float, whole_bytes: float, tensor: int) -> float:
    """Weight bytes one of ``tensor`` shards holds: the split part / T + the replicated rest.

    Example:
        >>> tensor_weight_bytes(split_bytes=8e6, whole_bytes=10e6, tensor=4)
        4000000.0
    """
    return split_bytes / tensor + (whole_bytes - split_bytes)
