"""`ClusterSpec`: the tasks of a TensorFlow job and their addresses, checked and immutable."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tfdist.cluster import hosts as _hosts
from tfdist.cluster._error import config_error, show
from tfdist.cluster.address import join_address, split_address
from tfdist.cluster.ports import release_ports, reserve_ports
from tfdist.cluster.roles import ROLES, TRAINING_ROLES, Task
from tfdist.cluster.slurm import slurm_host_slots
from tfdist.cluster.strategy import check_fits
from tfdist.cluster.tables import read_pai_table
from tfdist.cluster.tf_config import make_tf_config, parse_tf_config
from tfdist.cluster.validate import (
    check_role_list,
    check_roles,
    check_task_in_cluster,
)
from tfdist.core.environ import TF_CONFIG

__all__ = ["ClusterSpec"]

_WHERE = "cluster spec"


@dataclass(frozen=True)
class ClusterSpec:
    """The tasks of a job, by role, each a ``"host:port"`` (IPv6 hosts in brackets).

    A spec is checked when it is made (addresses, at most one chief and one evaluator, no address
    twice); `validate` adds the checks of a strategy. Its TF_CONFIGs never list the evaluator in
    ``cluster`` (tensorflow#46169); see `tf_config`.

    Attributes:
        chief: Zero or one address.
        worker: The workers' addresses.
        ps: The parameter servers' addresses.
        evaluator: Zero or one address.

    Example:
        >>> spec = ClusterSpec(chief=["h1:2222"], worker=["h1:2223", "h2:2222"])
        >>> [str(task) for task in spec.tasks()], spec.num_workers
        (['chief:0', 'worker:0', 'worker:1'], 3)
    """

    chief: tuple[str, ...] = ()
    worker: tuple[str, ...] = ()
    ps: tuple[str, ...] = ()
    evaluator: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for role in ROLES:
            addresses = check_role_list(role, getattr(self, role), _WHERE, allow_empty=True)
            object.__setattr__(self, role, addresses)
        check_roles(self.as_dict(include_evaluator=True), _WHERE)

    # ----------------------------------------------------------------------------- builders

    @classmethod
    def local(
        cls,
        workers: int = 2,
        ps: int = 0,
        chief: bool = False,
        evaluator: bool = False,
        host: str = "localhost",
        strategy: str | None = None,
    ) -> ClusterSpec:
        """Every task on this machine, each on a free port held by `reserve_ports`.

        The ports stay reserved (so no other builder or process is given them) until
        ``release_ports(spec.ports())``; the tasks' TensorFlow servers can bind them meanwhile.

        Example:
            >>> spec = ClusterSpec.local(workers=2, ps=1, chief=True)
            >>> spec.num_workers, len(spec.ps), spec.hosts()
            (3, 1, ['localhost'])
            >>> release_ports(spec.ports())
        """
        where = "local cluster"
        counts = _hosts.role_counts(
            None, workers=workers, ps=ps, chief=chief, evaluator=evaluator, where=where
        )
        ports = reserve_ports(sum(count for _, count in counts), host)
        try:
            places = [join_address(host.strip("[]"), port) for port in ports]
            return cls(**_hosts.assign(places, counts)).validate(strategy)
        except Exception:
            release_ports(ports)
            raise

    @classmethod
    def from_hosts(
        cls,
        hosts: str | Sequence[str],
        *,
        workers: int | None = None,
        ps: int = 0,
        chief: bool = False,
        evaluator: bool = False,
        base_port: int = _hosts.DEFAULT_BASE_PORT,
        strategy: str | None = None,
    ) -> ClusterSpec:
        """Lays tasks out on ``"host:slots"`` entries, like ``horovodrun -H h1:2,h2:2``.

        Slots are filled host-major by the tasks in canonical order (chief, workers, ps,
        evaluator); a task's port is ``base_port`` plus its slot on that host. ``workers=None``
        makes every remaining slot a worker.

        Example:
            >>> ClusterSpec.from_hosts("h1:2,h2:2", ps=1, chief=True).as_dict()
            {'chief': ['h1:2222'], 'worker': ['h1:2223', 'h2:2222'], 'ps': ['h2:2223']}
        """
        slots = _hosts.parse_hosts(hosts)
        roles = _hosts.layout(
            slots, workers=workers, ps=ps, chief=chief, evaluator=evaluator, base_port=base_port
        )
        return cls(**roles).validate(strategy)

    @classmethod
    def from_hostfile(cls, path: str | os.PathLike[str], **kwargs: Any) -> ClusterSpec:
        """Like `from_hosts`, with the hosts read from a file (``host:slots``, ``host slots=N``,
        or ``host`` per line; ``#`` comments and blank lines are ignored).

        Example:
            >>> import tempfile
            >>> with tempfile.NamedTemporaryFile("w", delete=False) as f:
            ...     _ = f.write("# my hosts\\nh1 slots=2\\n")
            >>> ClusterSpec.from_hostfile(f.name, chief=True).as_dict()
            {'chief': ['h1:2222'], 'worker': ['h1:2223']}
            >>> os.remove(f.name)
        """
        slots = _hosts.read_hostfile(path)
        return cls.from_hosts([join_address(host, count) for host, count in slots], **kwargs)

    @classmethod
    def from_tf_config(
        cls, value: str | Mapping[str, Any] | None = None, *, strategy: str | None = None
    ) -> ClusterSpec:
        """Parses and checks a TF_CONFIG (JSON text, a mapping, or None for the environment).

        Example:
            >>> text = ('{"cluster": {"worker": ["h:1", "h:2"]}, '
            ...         '"task": {"type": "worker", "index": 1}}')
            >>> ClusterSpec.from_tf_config(text).worker
            ('h:1', 'h:2')
        """
        roles, _ = parse_tf_config(value)
        check_fits(roles, strategy, TF_CONFIG)
        return cls(**roles)

    @classmethod
    def from_slurm(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        ps: int = 0,
        chief: bool = False,
        evaluator: bool = False,
        base_port: int = _hosts.DEFAULT_BASE_PORT,
        strategy: str | None = None,
    ) -> ClusterSpec:
        """Lays tasks out on a Slurm allocation's nodes, one per Slurm task (see `from_hosts`).

        Reads ``SLURM_JOB_NODELIST`` and ``SLURM_TASKS_PER_NODE`` (or ``SLURM_NTASKS_PER_NODE``,
        or ``SLURM_NTASKS`` split evenly) from ``env`` (default ``os.environ``). Rank ``r`` is the
        task on slot ``r``, host-major; `slurm_task` finds which slot a process holds under any
        srun distribution (see `tfdist.cluster.slurm`).

        Example:
            >>> env = {"SLURM_JOB_NODELIST": "n[01-02]", "SLURM_TASKS_PER_NODE": "2(x2)"}
            >>> ClusterSpec.from_slurm(env, ps=1, chief=True).ps
            ('n02:2223',)
        """
        slots = slurm_host_slots(env)
        roles = _hosts.layout(
            slots, ps=ps, chief=chief, evaluator=evaluator, base_port=base_port, where="Slurm job"
        )
        return cls(**roles).validate(strategy)

    @classmethod
    def from_pai_table(
        cls,
        path_or_rows: str | os.PathLike[str] | Iterable[object],
        job_name: str | None = None,
        *,
        host: str = "localhost",
        strategy: str | None = None,
    ) -> ClusterSpec:
        """Recreates a job of an Alibaba PAI ``pai_task_table.csv`` on ``host`` (like `local`).

        Example:
            >>> spec = ClusterSpec.from_pai_table([["j", "ps", "1.0", "600", ""],
            ...                                    ["j", "worker", "2.0", "800", "50"]])
            >>> len(spec.worker), len(spec.ps)
            (2, 1)
            >>> release_ports(spec.ports())
        """
        job = read_pai_table(path_or_rows, job_name)
        counts = job.local_kwargs()
        return cls.local(
            workers=int(counts["workers"]), ps=int(counts["ps"]), chief=bool(counts["chief"]),
            evaluator=bool(counts["evaluator"]), host=host, strategy=strategy,
        )

    # ------------------------------------------------------------------------------ queries

    def tasks(self) -> list[Task]:
        """Every task in canonical order: chief, workers, ps, evaluator.

        Example:
            >>> ClusterSpec(worker=["h:1"], ps=["h:2"]).tasks()
            [Task(type='worker', index=0), Task(type='ps', index=0)]
        """
        return [Task(role, i) for role in ROLES for i in range(len(getattr(self, role)))]

    def _task(self, task: Task | str) -> Task:
        task = Task.parse(task) if isinstance(task, str) else task
        if task.index >= len(getattr(self, task.type)):
            raise config_error(
                _WHERE, f"task {task} is not in the cluster.", received=show(str(task)),
                expected=f"one of {', '.join(str(t) for t in self.tasks())}",
                fix="Use a task listed in the spec.",
            )
        return task

    def address(self, task: Task | str) -> str:
        """The ``host:port`` of a task (a `Task` or ``"type:index"``).

        Example:
            >>> ClusterSpec(worker=["h1:1", "h2:1"]).address("worker:1")
            'h2:1'
        """
        task = self._task(task)
        return getattr(self, task.type)[task.index]

    def host(self, task: Task | str) -> str:
        """The host of a task, without port (and without brackets for IPv6).

        Example:
            >>> ClusterSpec(worker=["[::1]:2222"]).host("worker:0")
            '::1'
        """
        return split_address(self.address(task))[0]

    def hosts(self) -> list[str]:
        """The distinct hosts, in task order.

        Example:
            >>> ClusterSpec(chief=["a:1"], worker=["b:1", "a:2"]).hosts()
            ['a', 'b']
        """
        return list(dict.fromkeys(self.host(task) for task in self.tasks()))

    def ports(self) -> list[int]:
        """The port of every task, in task order (e.g. for `release_ports`).

        Example:
            >>> ClusterSpec(worker=["h:2222", "h:2223"]).ports()
            [2222, 2223]
        """
        return [split_address(self.address(task))[1] for task in self.tasks()]

    @property
    def num_workers(self) -> int:
        """Tasks that compute gradients in a multi-worker job: workers plus the chief.

        Example:
            >>> ClusterSpec(chief=["h:1"], worker=["h:2"], ps=["h:3"]).num_workers
            2
        """
        return len(self.chief) + len(self.worker)

    def task_at_rank(self, rank: int) -> Task:
        """The task at position ``rank`` of `tasks` (e.g. a Slurm or MPI rank).

        Example:
            >>> ClusterSpec(chief=["h:1"], worker=["h:2"]).task_at_rank(1)
            Task(type='worker', index=0)
        """
        tasks = self.tasks()
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < len(tasks):
            raise config_error(
                _WHERE, "rank is out of range.", received=show(rank),
                expected=f"an integer in 0..{len(tasks) - 1} ({len(tasks)} tasks)",
                fix="Start as many processes as the spec has tasks.",
            )
        return tasks[rank]

    # ------------------------------------------------------------------------------ outputs

    def as_dict(self, include_evaluator: bool = False) -> dict[str, list[str]]:
        """Role -> addresses, empty roles omitted (and the evaluator unless asked for).

        Example:
            >>> ClusterSpec(worker=["h:1"], evaluator=["h:9"]).as_dict()
            {'worker': ['h:1']}
        """
        roles = ROLES if include_evaluator else TRAINING_ROLES
        return {role: list(getattr(self, role)) for role in roles if getattr(self, role)}

    def tf_config(self, task_type: str, index: int = 0) -> dict[str, Any]:
        """The TF_CONFIG of one task: the training cluster (never the evaluator) and the task.

        ``evaluator:0`` is valid even if the spec has no evaluator.

        Example:
            >>> ClusterSpec(worker=["h:1"], evaluator=["h:9"]).tf_config("evaluator", 0)
            {'cluster': {'worker': ['h:1']}, 'task': {'type': 'evaluator', 'index': 0}}
        """
        task = Task(task_type, index)
        check_task_in_cluster(self.as_dict(include_evaluator=True), task, _WHERE)
        return make_tf_config(self.as_dict(), task)

    def tf_config_json(self, task_type: str, index: int = 0) -> str:
        """`tf_config` as JSON, ready for ``os.environ["TF_CONFIG"]``.

        Example:
            >>> ClusterSpec(worker=["h:1"]).tf_config_json("worker", 0)
            '{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 0}}'
        """
        return json.dumps(self.tf_config(task_type, index))

    def validate(self, strategy: str | None = None) -> ClusterSpec:
        """Checks that the cluster fits ``strategy``; returns ``self``.

        ``strategy`` is None (only the checks every cluster passes) or any name the strategy
        registry knows (`tfdist.core.registry`: the built-ins, a registered name, or
        ``package.module:Class``); its traits decide (`StrategyTraits.roles` and
        ``required_roles``). Of the built-ins, only ``"parameter_server"`` accepts ps tasks (and
        needs one, and a chief); ``"horovod"`` takes workers only.

        Example:
            >>> ClusterSpec(chief=["h:1"], ps=["h:2"]).validate("parameter_server").ps
            ('h:2',)
        """
        check_fits(self.as_dict(include_evaluator=True), strategy, _WHERE)
        return self
