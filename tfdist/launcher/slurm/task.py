"""``python -m tfdist.launcher.slurm.task -- COMMAND``: one TensorFlow task of a Slurm job step.

``srun`` starts this shim once per Slurm task (see ``tfdist-launch --export slurm``). It lays the
job out on the allocation with `ClusterSpec.from_slurm` (every node's tasks, host-major: chief,
workers, ps, evaluator), finds its own task with `slurm_task` (by node and local id, so any
``srun --distribution`` works), sets TF_CONFIG, and runs:

* tasks that train (a multi-worker job's chief and workers): COMMAND;
* the strategy's server roles (ParameterServer ``worker``/``ps``): ``python -m tfdist.server``
  instead of COMMAND;
* the evaluator: COMMAND as a sidecar: its failure is reported and this task exits 0;
* single-process strategies (default, mirrored): COMMAND without TF_CONFIG;
* Horovod ranks: COMMAND without TF_CONFIG, with the rank's Horovod variables
  (`tfdist.launcher.slurm.horovod.rank_env`; the batch script serves the rendezvous).

COMMAND runs as a child of the shim: when it fails, the shim names the task, its Slurm rank and
node before exiting with its status (128 + N for signal N); SIGTERM and SIGINT are passed on.

What each role runs comes from the strategy's traits, as for every other runner.

With ``--done-file`` (ParameterServer jobs), the chief writes its exit status to that file when
COMMAND ends, and the servers, which otherwise serve forever, stop when it appears.

Example:
    Print what rank 3 of a 2x2 allocation would run::

        SLURM_JOB_NODELIST='node[1-2]' SLURM_TASKS_PER_NODE='2(x2)' SLURM_PROCID=3 \\
            python -m tfdist.launcher.slurm.task --chief --dry-run -- python train.py
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tfdist.cluster import ClusterSpec, Task, slurm_task
from tfdist.core.registry import strategy_traits
from tfdist.core.traits import STRATEGY_ENV
from tfdist.errors import TfdistError
from tfdist.launcher.slurm.horovod import rank_env

__all__ = ["SlurmTaskPlan", "plan_slurm_task", "parse_args", "main"]

_POLL_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class SlurmTaskPlan:
    """What this Slurm task runs: its task, TF_CONFIG (None: single process), argv and kind."""

    task: Task
    tf_config: dict[str, Any] | None
    command: tuple[str, ...]
    kind: str  # "main", "service" or "sidecar", as in tfdist.launcher.process
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)  # e.g. Horovod's rank

    def describe(self) -> dict[str, Any]:
        return {"task": str(self.task), "tf_config": self.tf_config,
                "command": list(self.command), "kind": self.kind, "env": dict(self.env)}


def plan_slurm_task(
    command: Sequence[str],
    env: Mapping[str, str] | None = None,
    *,
    strategy: str = "multi_worker",
    ps: int = 0,
    chief: bool = False,
    evaluator: bool = False,
    base_port: int = 2222,
    script_on_all_tasks: bool = False,
) -> SlurmTaskPlan:
    """The plan of the Slurm task whose variables are in ``env`` (default ``os.environ``).

    Example:
        >>> env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)",
        ...        "SLURM_PROCID": "3"}
        >>> plan = plan_slurm_task(["python", "t.py"], env, strategy="parameter_server",
        ...                        ps=1, chief=True)
        >>> str(plan.task), plan.tf_config["cluster"]["ps"], plan.kind
        ('ps:0', ['n2:2223'], 'service')
    """
    traits = strategy_traits(strategy)
    if traits.single_process:
        return SlurmTaskPlan(Task("chief", 0), None, tuple(command), "main")
    if traits.launch == "ranks":
        variables = rank_env(env)
        return SlurmTaskPlan(Task("worker", int(variables["HOROVOD_RANK"])), None,
                             tuple(command), "main", variables)
    layout = {"ps": ps, "chief": chief, "evaluator": evaluator, "base_port": base_port}
    spec = ClusterSpec.from_slurm(env, strategy=strategy, **layout)
    task = slurm_task(env, **layout)
    argv = tuple(command)
    if task.type in traits.server_roles and not script_on_all_tasks:  # this role: the server
        argv = traits.task_argv(task.type, ())
    return SlurmTaskPlan(task, spec.tf_config(task.type, task.index), argv,
                         traits.task_kind(task.type))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses the shim's arguments; COMMAND follows ``--``.

    Example:
        >>> parse_args(["--ps", "1", "--chief", "--", "python", "t.py"]).command
        ['python', 't.py']
    """
    parser = argparse.ArgumentParser(
        prog="python -m tfdist.launcher.slurm.task",
        description="Run one task of a TensorFlow job inside a Slurm job step (under srun).",
    )
    layout = parser.add_argument_group("layout (the same on every task)")
    layout.add_argument("--strategy", default=os.environ.get(STRATEGY_ENV, "multi_worker"),
                        help="env TFDIST_STRATEGY; default multi_worker")
    layout.add_argument("--ps", type=int, default=0, help="parameter-server tasks (default 0)")
    layout.add_argument("--chief", action="store_true", help="the first task is the chief")
    layout.add_argument("--evaluator", action="store_true", help="the last task is an evaluator")
    layout.add_argument("--base-port", type=int, default=2222, help="first port on each node")
    layout.add_argument("--script-on-all-tasks", action="store_true",
                        help="worker and ps tasks run COMMAND too (it serves them itself)")
    parser.add_argument("--done-file", help="ParameterServer: chief writes it; servers stop on it")
    parser.add_argument("--dry-run", action="store_true",
                        help="print this task's plan as JSON and exit")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- python train.py ARGS")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("missing COMMAND after '--' (e.g. -- python train.py)")
    return args


def _wait_service(popen: subprocess.Popen[bytes], done_file: str | None) -> int:
    while popen.poll() is None:
        if done_file and os.path.exists(done_file):
            popen.terminate()
            return popen.wait()
        time.sleep(_POLL_SECONDS)
    return popen.returncode


def _where(task: Task) -> str:
    """``worker:1 (Slurm rank 2 on node n2)``: the task as both Slurm and TensorFlow name it."""
    rank, node = os.environ.get("SLURM_PROCID", "?"), os.environ.get("SLURMD_NODENAME", "?")
    return f"{task} (Slurm rank {rank} on node {node})"


def _describe_status(status: int) -> str:
    if status < 0:
        return f"was killed by {signal.Signals(-status).name}"
    return f"exited with status {status}"


def _start(plan: SlurmTaskPlan) -> subprocess.Popen[bytes]:
    """Starts COMMAND; SIGTERM and SIGINT sent to the shim are passed on to it."""
    env = {**os.environ, **plan.env}
    if plan.tf_config is not None:
        env["TF_CONFIG"] = json.dumps(plan.tf_config)
    popen = subprocess.Popen(list(plan.command), env=env)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: popen.send_signal(s))
    return popen


def run(plan: SlurmTaskPlan, done_file: str | None = None) -> int:
    """Runs ``plan`` to its end; returns the exit status for srun (128 + N for signal N)."""
    popen = _start(plan)
    if plan.kind == "service":
        return _wait_service(popen, done_file)
    status = popen.wait()
    if done_file:
        with open(done_file, "w") as file:
            file.write(f"{status}\n")
    if status == 0:
        return 0
    if plan.kind == "sidecar":
        print(f"[tfdist] sidecar {_where(plan.task)} {_describe_status(status)}; job goes on",
              file=sys.stderr, flush=True)
        return 0
    print(f"[tfdist] task {_where(plan.task)} {_describe_status(status)}; the job step ends",
          file=sys.stderr, flush=True)
    return 128 - status if status < 0 else status


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        plan = plan_slurm_task(args.command, strategy=args.strategy, ps=args.ps,
                               chief=args.chief, evaluator=args.evaluator,
                               base_port=args.base_port,
                               script_on_all_tasks=args.script_on_all_tasks)
    except TfdistError as err:
        print(f"tfdist.launcher.slurm.task: {err}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(json.dumps(plan.describe()))
        return 0
    done = args.done_file if plan.kind in ("main", "service") else None
    return run(plan, done)


if __name__ == "__main__":
    sys.exit(main())
