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
4. **Policy.** As the local runner (`tfdist.launcher.local`): a failed task stops every actor
   (the failing one is named, with its last lines); a role the strategy restarts alone is
   restarted by its actor; ``--max-restarts`` reruns the whole gang on a fresh placement group;
   a sidecar evaluator may fail; SIGTERM is forwarded with ``--preemption-grace``. Every wait on
   Ray has a timeout, and every actor is killed and the placement group removed on the way out.

Tasks run with the node's environment, the job's variables (`JobPlan.env`), the variables a
remote task of ``--hosts`` would get (`tfdist.launcher.ssh.forwarded_env`: ``PYTHONPATH`` and
``TFDIST_*``), and their TF_CONFIG; nothing secret is put on a command line. The script, the
Python and this working directory must exist on every node (a shared filesystem or one image).

Example:
    >>> from tfdist.launcher.plan import JobOptions, plan_job
    >>> plan = plan_job(JobOptions("train.py", workers=2))
    >>> [line["task"] for line in describe(plan, RayOptions())]
    ['worker:0', 'worker:1']
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType, ModuleType
from typing import Any

from tfdist.cluster import ClusterSpec, Task
from tfdist.cluster.address import join_address
from tfdist.core.traits import TaskKind
from tfdist.errors import (
    LaunchError,
    MissingDependencyError,
    TaskFailedError,
    TaskTimeoutError,
    format_error,
)
from tfdist.launcher.local import NOT_RESTARTED, exit_status, failure_message
from tfdist.launcher.output import LineFilter, shown_tasks, task_filters
from tfdist.launcher.plan import JobPlan
from tfdist.launcher.ray_actor import TaskActor
from tfdist.launcher.ray_options import RayOptions
from tfdist.launcher.ssh import forwarded_env
from tfdist.preemption import PREEMPTED_EXIT_STATUS

__all__ = ["RayOptions", "GangUnschedulableError", "run_on_ray", "describe"]

_POLL_SECONDS = 0.2
_CALL_TIMEOUT = 60.0  # one call to an actor that is up; they answer in milliseconds
_SIGTERM_STATUS = 128 + signal.SIGTERM
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


def _log(message: str) -> None:
    print(f"[tfdist-launch] {message}", file=sys.stderr, flush=True)


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
    returncode: int | None = None
    restarts: int = 0
    sidecar_failed: bool = False


class _Gang:
    """The placement group of one attempt and the actors in it; `close` removes both."""

    def __init__(self, ray: ModuleType, specs: list[_TaskSpec], options: RayOptions) -> None:
        self.ray, self.specs, self.options = ray, specs, options
        self.group: Any = None
        self.tasks: list[_Running] = []

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

    def start(self, envs: list[dict[str, str]], plan: JobPlan, unset: Sequence[str]) -> None:
        """Phase 2: every actor starts its task with its environment and output view."""
        cwd, log_dir = os.getcwd(), plan.options.log_dir
        shows = _output_filters(self.tasks, envs, plan)
        refs = [t.actor.start.remote(t.spec.name, t.spec.command, env, cwd, t.spec.kind, log_dir,
                                     unset, t.spec.max_restarts, shows[t.spec.name])
                for t, env in zip(self.tasks, envs, strict=True)]
        pids = self._get(refs, _CALL_TIMEOUT, "start its process")
        for task, pid in zip(self.tasks, pids, strict=True):
            _log(f"started {task.spec.name} (pid {pid} on its node)")

    def stop(self, grace: float) -> dict[str, int | None]:
        """Stops every task (SIGTERM, then SIGKILL after ``grace``); their exit statuses."""
        refs = {t.spec.name: t.actor.stop.remote(grace) for t in self.tasks}
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
        _log(f"output of {', '.join(hidden)} hidden unless it fails (--verbose shows it)")
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


def _environments(ray: ModuleType, plan: JobPlan, gang: _Gang, located: list[dict[str, Any]]
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


def _rank_environments(ray: ModuleType, gang: _Gang, located: list[dict[str, Any]],
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


def _poll(gang: _Gang) -> None:
    """Prints what every task printed since the last poll and records which have exited."""
    refs = [t.actor.poll.remote() for t in gang.tasks]
    for task, ref in zip(gang.tasks, refs, strict=True):
        try:
            task.returncode, lines = gang.ray.get(ref, timeout=_CALL_TIMEOUT)
        except (gang.ray.exceptions.RayActorError, gang.ray.exceptions.GetTimeoutError) as err:
            raise TaskFailedError(task.spec.name, -9, f"its Ray actor was lost: {err}") from None
        if lines:
            sys.stdout.write(lines)
            sys.stdout.flush()


def _first_failure(gang: _Gang) -> _Running | None:
    """The task whose exit ends the job, after restarting alone those the strategy restarts
    (the local runner's policy, `ProcessGroup.wait`)."""
    main_done = all(t.returncode == 0 for t in gang.tasks if t.spec.kind == "main")
    for task in gang.tasks:
        code, kind = task.returncode, task.spec.kind
        if code is None or (code == 0 and kind != "service"):
            continue
        if kind == "sidecar":
            if not task.sidecar_failed:
                task.sidecar_failed = True
                print(f"[tfdist] sidecar {task.spec.name} exited with status {code}; job goes on",
                      flush=True)
            continue
        if kind == "service" and main_done:
            continue
        if task.restarts < task.spec.max_restarts:
            task.restarts += 1
            gang.ray.get(task.actor.restart.remote(), timeout=_CALL_TIMEOUT)
            task.returncode = None
            continue
        return task
    return None


def _watch(gang: _Gang, plan: JobPlan) -> None:
    """Waits until every main task succeeded (then gives sidecars their grace).

    Raises:
        TaskFailedError: A task failed for good (named, with its last lines).
        TaskTimeoutError: The job's ``--timeout`` passed first.
    """
    timeout = plan.options.timeout
    deadline = time.monotonic() + timeout
    main = [t for t in gang.tasks if t.spec.kind == "main"]
    while True:
        _poll(gang)
        failed = _first_failure(gang)
        if failed is not None:
            tail = gang.ray.get(failed.actor.tail.remote(), timeout=_CALL_TIMEOUT)
            raise TaskFailedError(failed.spec.name, failed.returncode or 1, tail)
        if all(t.returncode == 0 for t in main):
            break
        if time.monotonic() > deadline:
            running = ", ".join(t.spec.name for t in main if t.returncode is None)
            raise TaskTimeoutError(f"The job did not finish within {timeout:g} s; still "
                                   f"running: {running}. Every task was stopped. Fix: raise "
                                   "--timeout, or check these tasks' output for a hang.")
        time.sleep(_POLL_SECONDS)
    grace_end = min(deadline, time.monotonic() + plan.options.evaluator_grace)
    sidecars = [t for t in gang.tasks if t.spec.kind == "sidecar"]
    while any(t.returncode is None for t in sidecars) and time.monotonic() < grace_end:
        time.sleep(_POLL_SECONDS)
        _poll(gang)
    _first_failure(gang)


class _Preempted(Exception):
    """This process received SIGTERM."""


def _raise_preempted(signum: int, frame: FrameType | None) -> None:
    raise _Preempted


def _preemption_outcome(gang: _Gang, grace: float) -> int:
    _log(f"received SIGTERM: forwarding it to every task; {grace:g} s to save and exit")
    codes = gang.stop(grace)
    main = [codes.get(t.spec.name) for t in gang.tasks if t.spec.kind == "main"]
    if all(code == 0 for code in main):
        return 0
    if all(code == PREEMPTED_EXIT_STATUS for code in main):
        _log(f"job preempted: every training task saved and exited with status "
             f"{PREEMPTED_EXIT_STATUS}. Run the same command again to resume from that step.")
        return PREEMPTED_EXIT_STATUS
    _log(f"job stopped by SIGTERM; exit statuses of the training tasks: {main}")
    return _SIGTERM_STATUS


def _run_gang(ray: ModuleType, plan: JobPlan, options: RayOptions) -> int:
    """One attempt: reserve the gang, start it in two phases, watch it, tear it down."""
    gang, rendezvous = _Gang(ray, _task_specs(plan), options), None
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_preempted) if in_main_thread else None
    try:
        gang.reserve()
        _log(f"gang of {len(gang.specs)} task(s) placed ({options.placement}, "
             f"{options.cpus_per_task:g} CPU each)")
        located = gang.spawn()
        envs, rendezvous, unset = _environments(ray, plan, gang, located)
        for task, where in zip(gang.tasks, located, strict=True):
            _log(f"task {task.spec.name} on {where['address']} (port {where['port']})")
        gang.start(envs, plan, (*unset, *_CLUSTER_SECRETS))
        _watch(gang, plan)
        _log(f"job finished: {len(gang.tasks)} task(s) succeeded")
        return 0
    except TaskFailedError as err:
        _log(failure_message(plan, err))
        return exit_status(err.returncode) or 1
    except TaskTimeoutError as err:
        _log(str(err))
        return 124
    except _Preempted:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return _preemption_outcome(gang, plan.options.preemption_grace)
    except KeyboardInterrupt:
        _log("interrupted; stopping every task")
        return 130
    finally:
        gang.stop(grace=5.0)
        gang.close()
        if rendezvous is not None:
            rendezvous.stop()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _connect(ray: ModuleType, options: RayOptions) -> bool:
    """Connects to the cluster; True when this call did (and `run_on_ray` disconnects)."""
    if ray.is_initialized():
        return False
    extra = {"include_dashboard": False} if options.address == "local" else {}
    try:
        ray.init(address=options.address, log_to_driver=False, logging_level="ERROR", **extra)
    except (ConnectionError, RuntimeError) as err:
        raise LaunchError(
            f"Cannot reach the Ray cluster at --ray {options.address} ({err}). Fix: start one "
            "(ray start --head), pass its address (--ray HOST:PORT, or RAY_ADDRESS), or use "
            "--ray local for a one-node cluster of this job alone; a cluster with token "
            "authentication (RAY_AUTH_MODE=token) also needs its token in RAY_AUTH_TOKEN or "
            "RAY_AUTH_TOKEN_PATH") from err
    return True


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
    options = options or RayOptions()
    ray = _ray()
    connected = _connect(ray, options)
    try:
        status = _run_gang(ray, plan, options)
        max_restarts = plan.options.max_restarts
        for attempt in range(1, max_restarts + 1):
            if status in NOT_RESTARTED:
                break
            _log(f"restarting the whole job ({attempt}/{max_restarts}) after exit status "
                 f"{status}")
            status = _run_gang(ray, plan, options)
        return status
    finally:
        if connected:
            ray.shutdown()
