"""The layouts the advisor considers for a cluster, and the command line that runs each.

A `Cluster` is what the advisor needs to know about the machines: training processes, hosts,
cores per host and (optionally) memory per device. It is read from a `ClusterSpec`, a host list
(``"node1:2,node2:2"``) or a count. `candidates` lists, for ``P`` training processes: one
process (``default``); synchronous all-reduce on ``P`` (TF's ring, Horovod's); parameter
servers with ``k`` shards beside ``P`` workers; pipelines of ``K`` stages (``K`` dividing ``P``,
``D = P / K`` replicas) with ``M`` micro-batches; and, for a model with attention heads, each
layer split ``T`` ways (``D x K x T = P``), in Alpa's two levels: a tensor group within a host
(``T`` divides a host's processes; its activations are all-reduced at every block), pipeline
stages across hosts. A layout is offered only where a registered strategy takes its options
(`tensor_strategies`): tensor layouts appear once a strategy takes ``--tensor``.

Example:
    >>> [c.label for c in candidates(Cluster(processes=2), batch=64, micro_batches=(4,))]
    ['default x1', 'multi_worker x2', 'horovod x2', 'multi_worker x2 zero=1', \
'multi_worker x2 zero=2', 'multi_worker x2 zero=3', 'parameter_server x2 +1ps', \
'parameter_server x2 +2ps', 'pipeline K=2 M=4']
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from tfdist.errors import AdviseError, TfdistError, format_error

__all__ = ["Cluster", "Candidate", "as_cluster", "candidates", "tensor_sizes", "tensor_strategies"]


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The machines a job may use.

    Attributes:
        processes: Training processes (workers, ranks, or D x K pipeline processes).
        hosts: Distinct hosts they run on (processes are spread evenly).
        cores: CPU cores per host (a fraction when measured: `cores.usable_cores`).
        device_memory: Bytes one process (device) may hold; None: no limit.
        host_names: The hosts, when known (a probe can only run on this one).
        speed: How fast one process computes now against when the model was profiled
            (1.0: as fast; 0.5: half as fast, the machine's other load having grown; the advise
            benchmark measures it as a reference step's time then over now). Compute terms
            are divided by it.

    Example:
        >>> Cluster(processes=4, hosts=2).per_host
        2
    """

    processes: int
    hosts: int = 1
    cores: float = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)
    device_memory: float | None = None
    host_names: tuple[str, ...] = ()
    speed: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.speed, bool) or not isinstance(self.speed, (int, float)) or not (
                self.speed > 0):
            raise AdviseError(format_error(
                "Cluster speed must be a positive number.", received=f"speed={self.speed!r}",
                expected="a number > 0 (1.0: the profile's speed)",
                fix="leave it out (1.0), or pass a measured ratio of step times"))
        for name in ("processes", "hosts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise AdviseError(format_error(
                    f"Cluster {name} must be a positive int.", received=f"{name}={value!r}",
                    expected="an int >= 1", fix=f"pass {name}=2"))
        # a measurement on a busy machine: a process may get less than one core (0.997)
        if isinstance(self.cores, bool) or not isinstance(self.cores, (int, float)) or not (
                self.cores > 0):
            raise AdviseError(format_error(
                "Cluster cores must be a positive number.", received=f"cores={self.cores!r}",
                expected="a number > 0 (cores measured on a busy machine may be fractional)",
                fix="pass cores=2, or leave it out (this machine's count)"))
        if self.device_memory is not None and not self.device_memory > 0:
            raise AdviseError(format_error(
                "device_memory must be a positive number of bytes.",
                received=f"device_memory={self.device_memory!r}", expected="bytes > 0, or None",
                fix="pass device_memory=16e9 (16 GB), or leave it out"))

    @property
    def per_host(self) -> int:
        """Training processes on the busiest host."""
        return -(-self.processes // self.hosts)


def as_cluster(cluster: Any, device_memory: float | None = None) -> Cluster:
    """A `Cluster` from a `Cluster`, a `ClusterSpec`, a host list string or a process count.

    Raises:
        AdviseError: anything else, or a host list that does not parse.

    Example:
        >>> as_cluster("localhost:2").processes, as_cluster(3).hosts
        (2, 1)
    """
    from tfdist.cluster import ClusterSpec, parse_hosts

    if isinstance(cluster, Cluster):
        return cluster if device_memory is None else dataclasses.replace(
            cluster, device_memory=device_memory)
    if isinstance(cluster, int) and not isinstance(cluster, bool):
        return Cluster(processes=cluster, device_memory=device_memory)
    if isinstance(cluster, ClusterSpec):
        hosts = tuple(dict.fromkeys(cluster.hosts()))
        return Cluster(processes=max(1, cluster.num_workers), hosts=len(hosts),
                       device_memory=device_memory, host_names=hosts)
    if isinstance(cluster, str):
        try:
            slots = parse_hosts(cluster)
        except TfdistError as err:
            raise AdviseError(str(err)) from err
        return Cluster(processes=sum(n for _, n in slots), hosts=len(slots),
                       device_memory=device_memory, host_names=tuple(h for h, _ in slots))
    raise AdviseError(format_error(
        "Cannot read a cluster from this value.", received=repr(cluster),
        expected="a process count (2), a host list ('node1:2,node2:2'), a tfdist.ClusterSpec "
        "or a tfdist.advise.Cluster", fix="pass cluster=2 for two processes on this machine"))


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One layout: a strategy and its sizes.

    Attributes:
        strategy: The tfdist strategy name.
        processes: Training processes (workers or ranks; D x K for a pipeline).
        ps: Parameter servers (shards), beside the workers.
        stages: Pipeline stages K.
        micro_batches: Pipeline micro-batches M.
        tensor: Tensor shards T of each stage's layers.
        schedule: The pipeline schedule (a name of `tfdist.pipeline.schedule.SCHEDULES`).
        zero: The ZeRO stage of a ``multi_worker`` layout, or of a pipeline's or tensor
            layout's data axis (D >= 2; 0: replicated).

    Example:
        >>> Candidate("tensor", 4, tensor=2).label, Candidate("pipeline", 8, 2, 2, 4, 2).label
        ('tensor D=2 x T=2', 'pipeline D=2 x K=2 x T=2 M=4')
    """

    strategy: str
    processes: int
    ps: int = 0
    stages: int = 1
    micro_batches: int = 1
    tensor: int = 1
    schedule: str = "gpipe"
    zero: int = 0

    @property
    def replicas(self) -> int:
        """D, the data-parallel replicas (``processes / (K T)``)."""
        return self.processes // (self.stages * self.tensor)

    @property
    def label(self) -> str:
        d = f"D={self.replicas} x " if self.replicas > 1 else ""
        t = f"T={self.tensor}" if self.tensor > 1 else ""
        zero = f" zero={self.zero}" if self.zero else ""
        if self.stages > 1:
            schedule = "" if self.schedule == "gpipe" else f" {self.schedule}"
            return (f"{self.strategy} {d}K={self.stages}{' x ' + t if t else ''} "
                    f"M={self.micro_batches}{schedule}{zero}")
        if t:
            return f"{self.strategy} {d}{t}{zero}"
        return f"{self.strategy} x{self.processes}{zero}" + (f" +{self.ps}ps" if self.ps else "")

    def launch_argv(self, script: str = "train.py") -> list[str]:
        """The ``tfdist-launch`` command line that runs ``script`` in this layout.

        Example:
            >>> Candidate("pipeline", 4, stages=2, micro_batches=4).launch_argv()
            ['tfdist-launch', '--strategy', 'pipeline', '--workers', '4', '--stages', '2', \
'--micro-batches', '4', 'train.py']
        """
        argv = ["tfdist-launch", "--strategy", self.strategy, "--workers", str(self.processes)]
        if self.ps:
            argv += ["--ps", str(self.ps)]
        if self.stages > 1:
            argv += ["--stages", str(self.stages), "--micro-batches", str(self.micro_batches)]
            argv += ["--schedule", self.schedule] if self.schedule != "gpipe" else []
        if self.tensor > 1:
            argv += ["--tensor", str(self.tensor)]
        if self.zero:
            argv += ["--zero", str(self.zero)]
        if self.processes == 1 and not self.ps:
            argv = ["python"]
        return [*argv, script]


def tensor_strategies() -> dict[int, str]:
    """For a layout of one stage (``1``) and of several (``2``), the registered strategy that
    takes ``--tensor`` there (the registry's traits say which; none yet: an empty dict).

    Example:
        >>> set(tensor_strategies()) <= {1, 2}
        True
    """
    from tfdist.core.registry import strategies_taking

    taking = strategies_taking("tensor")
    staged = [name for name in taking if name in strategies_taking("stages")]
    plain = [name for name in taking if name not in staged]
    found = {1: (plain or taking)[0]} if taking else {}
    return found | ({2: staged[0]} if staged else {})


def tensor_sizes(cluster: Cluster, heads: int) -> list[int]:
    """The tensor shard counts worth trying: ``T > 1`` dividing the attention ``heads``, the
    processes, and a host's processes (a tensor group stays on one host: Alpa's inner level).

    Example:
        >>> tensor_sizes(Cluster(8, hosts=2), heads=8), tensor_sizes(Cluster(4), heads=0)
        ([2, 4], [])
    """
    per_host = cluster.processes // cluster.hosts if cluster.processes % cluster.hosts == 0 else 1
    return [t for t in range(2, cluster.processes + 1)
            if heads and heads % t == 0 and cluster.processes % t == 0 and per_host % t == 0]


def candidates(cluster: Cluster, batch: int, micro_batches: Sequence[int] = (2, 4, 8),
               max_ps: int = 2, backends: Sequence[str] = ("tf", "horovod"),
               layers: int | None = None, heads: int = 0,
               tensor_by: dict[int, str] | None = None) -> list[Candidate]:
    """Every layout worth predicting for ``cluster`` and a global ``batch``.

    ``heads``: the model's attention heads (0: no tensor layouts); ``tensor_by``: which strategy
    runs a tensor layout of one stage (key 1) and of several (key 2), default
    `tensor_strategies`.
    """
    p = cluster.processes
    out = [Candidate("default", 1)]
    if p > 1:
        out += [Candidate(name, p) for backend, name in (("tf", "multi_worker"),
                                                         ("horovod", "horovod"))
                if backend in backends]
        if "tf" in backends:
            out += [Candidate("multi_worker", p, zero=stage) for stage in (1, 2, 3)]
    out += [Candidate("parameter_server", p, ps=k) for k in range(1, max_ps + 1)]
    out += _pipelines(p, batch, micro_batches, layers, tensor=1, strategy="pipeline")
    by = tensor_strategies() if tensor_by is None else tensor_by
    for t in tensor_sizes(cluster, heads):
        if 1 in by and batch % (p // t) == 0:
            out.append(Candidate(by[1], p, tensor=t))
        if 2 in by:
            out += _pipelines(p, batch, micro_batches, layers, tensor=t, strategy=by[2])
    if cluster.device_memory is not None:  # a memory bound: ZeRO on the data axes too
        out += zero_variants(out)
    return out


def zero_variants(layouts: Sequence[Candidate]) -> list[Candidate]:
    """Each pipeline (of whole stages) or tensor layout of D >= 2 replicas with ZeRO stages 1,
    2 and 3 on its data axis (a pipeline of tensor-split stages refuses ZeRO).

    Example:
        >>> [c.label for c in zero_variants([Candidate("pipeline", 4, stages=2,
        ...                                            micro_batches=2)])]
        ['pipeline D=2 x K=2 M=2 zero=1', 'pipeline D=2 x K=2 M=2 zero=2', \
'pipeline D=2 x K=2 M=2 zero=3']
    """
    out = []
    for c in layouts:
        if c.zero or c.replicas < 2 or (c.stages == 1) == (c.tensor == 1):
            continue
        out += [dataclasses.replace(c, zero=stage) for stage in (1, 2, 3)]
    return out


def _pipelines(p: int, batch: int, micro_batches: Sequence[int], layers: int | None,
               tensor: int, strategy: str) -> list[Candidate]:
    """Pipelines of ``K > 1`` stages, each on ``tensor`` processes, ``D = p / (K T)``."""
    out = []
    for k in range(2, p // tensor + 1):
        if (p // tensor) % k or (layers is not None and k > layers):
            continue
        for m in micro_batches:
            if batch % ((p // (k * tensor)) * m) == 0:
                out.append(Candidate(strategy, p, stages=k, micro_batches=m, tensor=tensor))
    return out
