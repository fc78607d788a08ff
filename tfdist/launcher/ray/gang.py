"""Run a `JobPlan` on a Ray cluster: ``tfdist-launch --ray [ADDRESS]``, or `run_on_ray`.

One Ray actor per task (a Horovod job: per rank), each holding one bundle of a placement group,
so the whole gang is scheduled together or not at all:

1. **Gang.** A placement group with one ``{"CPU": cpus_per_task}`` bundle per task, strategy
   ``SPREAD`` by default (tasks on as many nodes as have room; ``PACK`` fills a node first).
   ``STRICT_SPREAD`` is not offered: it cannot place two tasks on one node, so a job could never
   run on a one-node cluster. A gang larger than the whole cluster fails at once, naming the
   resources asked and those the cluster has; one that fits but finds them taken waits up to
   ``gang_timeout`` seconds, then fails the same way (the placement group is removed). Nothing
   of the job has started by then.
2. **Addresses (two-phase start).** Each actor reserves a free port on its own node's address
   (`tfdist.cluster.reserve_ports`) and reports it; once every actor has, the TF_CONFIGs are
   built from those addresses (Horovod: the Gloo rendezvous, `tfdist.horovod.rendezvous`, served
   by this process on its node address, and each rank's variables).
3. **Run.** Each actor runs its task's command, the one the local runner runs, as a child process
   (`ProcessGroup`: its own session, killed with the actor), and keeps its output, which this
   process prints with the task's prefix (``[worker:1] ...``).
4. **Policy.** The one of every runner (`tfdist.launcher.supervisor.Supervisor`; `RayGang` is
   its Ray `TaskGroup`): a failed task stops every actor (the failing one is named, with its
   last lines); a role the strategy restarts alone is restarted by its actor; ``--max-restarts``
   reruns the whole gang on a fresh placement group; a sidecar evaluator may fail; SIGTERM is
   forwarded with ``--preemption-grace``. Every wait on Ray has a timeout, and every actor is
   killed and the placement group removed on the way out.

Tasks run with the node's environment, the job's variables (`JobPlan.env`), the variables a
remote task of ``--hosts`` would get (`tfdist.launcher.hosts.ssh.forwarded_env`: ``PYTHONPATH`` and
``TFDIST_*``), and their TF_CONFIG; nothing secret is put on a command line. The script, the
Python and this working directory must exist on every node (a shared filesystem or one image).

Example:
    >>> from tfdist.launcher.plan import JobOptions, plan_job
    >>> plan = plan_job(JobOptions("train.py", workers=2))
    >>> [line["task"] for line in describe(plan, RayOptions())]
    ['worker:0', 'worker:1']
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

from tfdist.cluster import ClusterSpec, Task
from tfdist.cluster.address import join_address
from tfdist.core.traits import TaskKind
from tfdist.errors import LaunchError, MissingDependencyError, TaskFailedError, format_error
from tfdist.launcher import supervisor
from tfdist.launcher.hosts.ssh import forwarded_env
from tfdist.launcher.output import LineFilter, shown_tasks, task_filters
from tfdist.launcher.plan import JobPlan
from tfdist.launcher.ray.actor import TaskActor
from tfdist.launcher.ray.options import RayOptions
from tfdist.launcher.supervisor import Member, log

__all__ = ["RayOptions", "GangUnschedulableError", "RayGang", "run_on_ray", "describe"]

_POLL_SECONDS = 0.2
_CALL_TIMEOUT = 60.0  # one call to an actor that is up; they answer in milliseconds
# A node's Ray token (token authentication): the tasks run user code and need no cluster access.
_CLUSTER_SECRETS = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


class GangUnschedulableError(LaunchError):
    """The Ray cluster cannot hold every task of the job at once; nothing was started."""


def _ray() -> ModuleType:
    try:
        import ray
    except ImportError as err:
        raise MissingDependencyError(format_error(
            f"--ray needs the ray package ({err}).", received="no importable ray",
            expected="ray 2.x", fix="pip install 'tfdist[ray]' (or: pip install 'ray[default]')",
        )) from err
    return ray


@dataclasses.dataclass(frozen=True)
class _TaskSpec:
    """One task of the job as this runner starts it (its TF_CONFIG comes later)."""

    name: str
    task: Task
    command: tuple[str, ...]
    kind: TaskKind
    max_restarts: int


def _task_specs(plan: JobPlan) -> list[_TaskSpec]:
    """The plan's tasks; a Horovod job's ranks are tasks here (no ``horovodrun``)."""
    if plan.traits.launch == "ranks":
        return [_TaskSpec(f"rank:{r}", Task("worker", r), plan.task_argv("worker"), "main", 0)
                for r in range(plan.roles["worker"])]
    return [_TaskSpec(str(t), t, plan.task_argv(t.type), plan.task_kind(t.type),
                      plan.restarts(t.type)) for t in plan.tasks()]


def describe(plan: JobPlan, options: RayOptions) -> list[dict[str, Any]]:
    """What ``--ray --dry-run`` prints: one object per task (addresses are chosen at start)."""
    return [{"task": spec.name, "command": list(spec.command), "kind": spec.kind,
             "bundle": {"CPU": options.cpus_per_task}, "placement": options.placement,
             "env": dict(plan.env), "tf_config": "built from the actors' addresses at start"
             if plan.traits.launch == "tasks" else None} for spec in _task_specs(plan)]


@dataclasses.dataclass
class _Running:
    """A task of the running gang, as this process tracks it."""

    spec: _TaskSpec
    actor: Any


class RayGang:
    """The Ray runner's `TaskGroup`: one attempt's placement group, its actors and tasks.

    `launch` reserves the gang, starts an actor per task and then (two-phase) the tasks; the
    context manager's exit stops them, kills every actor and removes the placement group.
    """

    poll_interval = _POLL_SECONDS

    def __init__(self, plan: JobPlan, options: RayOptions | None = None) -> None:
        self.plan, self.options = plan, options or RayOptions()
        self.specs = _task_specs(plan)
        self.ray: Any = None
        self.group: Any = None
        self.tasks: list[_Running] = []
        self.rendezvous: Any = None

    @classmethod
    @contextlib.contextmanager
    def session(cls, options: RayOptions | None) -> Iterator[None]:
        """Connected to the cluster for every attempt of a job (disconnects if it connected)."""
        options = options or RayOptions()
        ray = _ray()
        connected = _connect(ray, options)
        try:
            yield
        finally:
            if connected:
                ray.shutdown()

    def __enter__(self) -> RayGang:
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.stop(grace=5.0)
        finally:
            self.close()
            if self.rendezvous is not None:
                self.rendezvous.stop()

    def members(self) -> list[Member]:
        specs = [t.spec for t in self.tasks] or self.specs
        shown = shown_tasks([s.name for s in specs], {s.name: s.kind for s in specs})
        verbose = self.plan.options.verbose
        return [Member(s.name, s.kind, s.max_restarts,
                       "all" if verbose else "filtered" if s.name in shown else "hidden")
                for s in specs]

    def launch(self) -> None:
        """Reserves the gang, starts its actors, then its tasks with their TF_CONFIGs."""
        self.ray = _ray()
        self.reserve()
        log(f"gang of {len(self.specs)} task(s) placed ({self.options.placement}, "
            f"{self.options.cpus_per_task:g} CPU each)")
        located = self.spawn()
        envs, self.rendezvous, unset = _environments(self.ray, self.plan, self, located)
        for task, where in zip(self.tasks, located, strict=True):
            log(f"task {task.spec.name} on {where['address']} (port {where['port']})")
        self.start(envs, (*unset, *_CLUSTER_SECRETS))

    def reserve(self) -> None:
        """Creates the placement group and waits (bounded) until all of it is held."""
        from ray.util.placement_group import placement_group, remove_placement_group

        _check_fits(self.ray, len(self.specs), self.options)
        bundles = [{"CPU": self.options.cpus_per_task} for _ in self.specs]
        self.group = placement_group(bundles, strategy=self.options.placement)
        try:
            self.ray.get(self.group.ready(), timeout=self.options.gang_timeout)
        except self.ray.exceptions.GetTimeoutError:
            remove_placement_group(self.group)
            self.group = None
            raise GangUnschedulableError(_gang_message(
                self.ray, len(self.specs), self.options,
                f"its resources were not free within {self.options.gang_timeout:g} s")) from None

    def spawn(self) -> list[dict[str, Any]]:
        """Starts one actor per bundle; returns where each is (phase 1 of the start)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor_class = self.ray.remote(TaskActor)
        for index, spec in enumerate(self.specs):
            strategy = PlacementGroupSchedulingStrategy(
                self.group, placement_group_bundle_index=index)
            actor = actor_class.options(
                num_cpus=self.options.cpus_per_task, max_restarts=0, scheduling_strategy=strategy,
                runtime_env={"env_vars": forwarded_env()}).remote()  # where tfdist is
            self.tasks.append(_Running(spec, actor))
        return self._get([t.actor.locate.remote() for t in self.tasks],
                         self.options.gang_timeout, "start its Ray actor")

    def _get(self, refs: list[Any], timeout: float, what: str) -> list[Any]:
        try:
            return self.ray.get(refs, timeout=timeout)
        except self.ray.exceptions.GetTimeoutError:
            raise LaunchError(f"A task did not {what} within {timeout:g} s; every actor was "
                              "stopped. Fix: check `ray status`, or raise --ray-gang-timeout"
                              ) from None

    def start(self, envs: list[dict[str, str]], unset: Sequence[str]) -> None:
        """Phase 2: every actor starts its task with its environment and output view."""
        cwd, log_dir = os.getcwd(), self.plan.options.log_dir
        shows = _output_filters(self.tasks, envs, self.plan)
        refs = [t.actor.start.remote(t.spec.name, t.spec.command, env, cwd, t.spec.kind, log_dir,
                                     unset, t.spec.max_restarts, shows[t.spec.name])
                for t, env in zip(self.tasks, envs, strict=True)]
        pids = self._get(refs, _CALL_TIMEOUT, "start its process")
        for task, pid in zip(self.tasks, pids, strict=True):
            log(f"started {task.spec.name} (pid {pid} on its node)")

    def poll(self) -> dict[str, int | None]:
        """Prints what every task printed since the last poll; each one's exit status.

        Raises:
            TaskFailedError: A task's actor was lost (its node died).
        """
        refs = [t.actor.poll.remote() for t in self.tasks]
        codes: dict[str, int | None] = {}
        for task, ref in zip(self.tasks, refs, strict=True):
            try:
                codes[task.spec.name], lines = self.ray.get(ref, timeout=_CALL_TIMEOUT)
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.GetTimeoutError) as err:
                raise TaskFailedError(task.spec.name, -9, f"its Ray actor was lost: {err}"
                                      ) from None
            if lines:
                sys.stdout.write(lines)
                sys.stdout.flush()
        return codes

    def _actor(self, name: str) -> Any:
        return next(t.actor for t in self.tasks if t.spec.name == name)

    def restart(self, name: str) -> int:
        return int(self.ray.get(self._actor(name).restart.remote(), timeout=_CALL_TIMEOUT))

    def tail(self, name: str, lines: int = 20) -> str:
        return str(self.ray.get(self._actor(name).tail.remote(lines), timeout=_CALL_TIMEOUT))

    def stopped(self) -> list[str]:
        """Not known here: the tasks' processes are on the cluster's nodes."""
        return []

    def failed_within(self, name: str) -> None:
        """Ray runs each Horovod rank as its own task: none runs processes of its own."""
        return None

    def announce(self, message: str) -> None:
        print(f"[tfdist] {message}", flush=True)

    def stop(self, grace: float | None = None) -> dict[str, int | None]:
        """Stops every task (SIGTERM, then SIGKILL after ``grace``); their exit statuses."""
        grace = 5.0 if grace is None else grace
        refs = {t.spec.name: t.actor.stop.remote(grace) for t in self.tasks}
        if not refs:
            return {}
        ready, _ = self.ray.wait(list(refs.values()), num_returns=len(refs),
                                 timeout=grace + _CALL_TIMEOUT)
        codes: dict[str, int | None] = {}
        for name, ref in refs.items():
            try:
                codes[name], lines = self.ray.get(ref, timeout=0) if ref in ready else (None, "")
            except self.ray.exceptions.RayError:
                codes[name], lines = None, ""
            sys.stdout.write(lines)  # what it printed since the last poll
        sys.stdout.flush()
        return codes

    def close(self) -> None:
        """Kills every actor (and so its task) and removes the placement group."""
        if self.ray is None:
            return
        from ray.util.placement_group import remove_placement_group

        for task in self.tasks:
            self.ray.kill(task.actor, no_restart=True)
        if self.group is not None:
            remove_placement_group(self.group)


def _output_filters(tasks: list[_Running], envs: list[dict[str, str]], plan: JobPlan
                    ) -> dict[str, LineFilter | None]:
    """Which lines of each task are printed, as the local runner decides it (`output`)."""
    named = [(t.spec.name, t.spec.kind, env) for t, env in zip(tasks, envs, strict=True)]
    shown = shown_tasks([n for n, _, _ in named], {n: kind for n, kind, _ in named})
    hidden = [name for name, _, _ in named if name not in shown]
    if hidden and not plan.options.verbose:
        log(f"output of {', '.join(hidden)} hidden unless it fails (--verbose shows it)")
    return task_filters(named, plan.options.verbose)


def _cluster_cpus(ray: ModuleType) -> tuple[float, float, int]:
    """The cluster's CPUs in all, those of its largest node, and its alive nodes."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    cpus = [float(n.get("Resources", {}).get("CPU", 0)) for n in nodes]
    return sum(cpus), max(cpus, default=0.0), len(nodes)


def _gang_message(ray: ModuleType, count: int, options: RayOptions, why: str) -> str:
    total, largest, nodes = _cluster_cpus(ray)
    free = float(ray.available_resources().get("CPU", 0))
    return (
        f"The Ray cluster cannot hold the job's {count} task(s) at once ({why}); the gang starts "
        f"whole or not at all, and nothing was started. Asked: {count} bundle(s) of "
        f"{{CPU: {options.cpus_per_task:g}}} = {count * options.cpus_per_task:g} CPU, placement "
        f"{options.placement}. Cluster: {total:g} CPU on {nodes} node(s) (largest node "
        f"{largest:g} CPU), {free:g} CPU free now. Fix: fewer tasks (--workers, --ps), a smaller "
        f"--ray-cpus-per-task, or more nodes (ray start --address=HEAD:PORT on another machine)")


def _check_fits(ray: ModuleType, count: int, options: RayOptions) -> None:
    """Fails at once when the gang can never fit (waiting for free resources cannot help)."""
    total, largest, _ = _cluster_cpus(ray)
    if options.cpus_per_task > largest:
        raise GangUnschedulableError(_gang_message(
            ray, count, options, "no node has the CPUs of one task"))
    if count * options.cpus_per_task > total:
        raise GangUnschedulableError(_gang_message(
            ray, count, options, "the whole cluster has fewer CPUs"))


def _environments(ray: ModuleType, plan: JobPlan, gang: RayGang, located: list[dict[str, Any]]
                  ) -> tuple[list[dict[str, str]], Any, tuple[str, ...]]:
    """Each task's variables from where the actors are (phase 2), the Horovod rendezvous (or
    None), and the variables no task may inherit from its node."""
    base = {**forwarded_env(names=gang.options.env_names), **plan.env}
    if plan.traits.launch == "ranks":
        return (*_rank_environments(ray, gang, located, base), ("TF_CONFIG",))
    if plan.traits.single_process:
        return [dict(base)], None, ("TF_CONFIG",)
    addresses: dict[str, list[str]] = {}
    for task, where in zip(gang.tasks, located, strict=True):
        addresses.setdefault(task.spec.task.type, []).append(
            join_address(where["address"], where["port"]))
    spec = ClusterSpec(**{role: tuple(found) for role, found in addresses.items()})
    envs = [{**base, "TF_CONFIG": spec.tf_config_json(t.spec.task.type, t.spec.task.index)}
            for t in gang.tasks]
    return envs, None, ()


def _rank_environments(ray: ModuleType, gang: RayGang, located: list[dict[str, Any]],
                       base: dict[str, str]) -> tuple[list[dict[str, str]], Any]:
    """Horovod ranks host-major over the actors' nodes, with a Gloo rendezvous served here."""
    from tfdist.horovod.rendezvous import GlooRendezvous, rank_order

    hosts = [where["address"] for where in located]
    rendezvous = GlooRendezvous.for_hosts(ray.util.get_node_ip_address(), hosts).start()
    order = rank_order(hosts)
    gang.tasks = [gang.tasks[index] for index in order]  # from here on in rank order
    located[:] = [located[index] for index in order]
    envs = []
    for rank, (task, where) in enumerate(zip(gang.tasks, located, strict=True)):
        task.spec = dataclasses.replace(task.spec, name=f"rank:{rank}", task=Task("worker", rank))
        envs.append({**base, **rendezvous.rank_env(rank, where["interface"])})
    return envs, rendezvous


def _connect(ray: ModuleType, options: RayOptions) -> bool:
    """Connects to the cluster within ``options.gang_timeout`` seconds; True when this call did
    (and `run_on_ray` disconnects).

    Ray's own ``ray.init`` waits for ever (retrying) on an address where nothing answers, so the
    address is tried first (a refused or unanswered TCP connection fails at once, or at the
    deadline), and ``ray.init`` runs on a thread that is waited for until the deadline.
    """
    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS") if options.address == "auto" else options.address
    deadline = options.gang_timeout
    extra = {"include_dashboard": False} if options.address == "local" else {}
    try:
        if address and address != "local":
            _check_reachable(address, deadline)
        _bounded(lambda: ray.init(address=options.address, log_to_driver=False,
                                  logging_level="ERROR", **extra), deadline)
    except (ConnectionError, RuntimeError, OSError, TimeoutError) as err:
        raise LaunchError(
            f"Cannot reach the Ray cluster at --ray {options.address}"
            f"{f' ({address})' if address not in (None, options.address) else ''} within "
            f"{deadline:g} s ({err}). Fix: start one (ray start --head), pass its address "
            "(--ray HOST:PORT, or RAY_ADDRESS), or use --ray local for a one-node cluster of this "
            "job alone; a cluster with token authentication (RAY_AUTH_MODE=token) also needs its "
            "token in RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH; a slow cluster, a longer "
            "--ray-gang-timeout") from err
    return True


def _check_reachable(address: str, timeout: float) -> None:
    """Raises OSError unless a TCP connection to ``address`` (``[ray://]HOST:PORT``) opens."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        return  # not HOST:PORT: Ray resolves it (and `_bounded` keeps the deadline)
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
        pass


def _bounded(call: Callable[[], object], timeout: float) -> None:
    """Runs ``call`` on a daemon thread; raises TimeoutError if it has not returned in
    ``timeout`` seconds, and re-raises what it raised."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
            failure.append(err)

    thread = threading.Thread(target=run, name="tfdist-ray-connect", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"no answer from the cluster in {timeout:g} s")
    if failure:
        raise failure[0]


def run_on_ray(plan: JobPlan, options: RayOptions | None = None) -> int:
    """Runs ``plan`` on a Ray cluster; after a task failure, reruns the whole gang up to
    ``plan.options.max_restarts`` times (a fresh placement group and fresh ports).

    Returns:
        0 on success, else the exit status of the task that failed first (124: timeout).

    Raises:
        GangUnschedulableError: The cluster cannot hold the gang (nothing was started).
        LaunchError: The cluster cannot be reached, or an actor did not start in time.
        MissingDependencyError: ``ray`` is not installed.

    Example:
        >>> from tfdist.launcher.plan import JobOptions, plan_job
        >>> plan = plan_job(JobOptions("train.py", workers=2))
        >>> run_on_ray(plan, RayOptions(address="127.0.0.1:6379"))  # doctest: +SKIP
        0
    """
    return supervisor.run_job(plan, "ray", options)
