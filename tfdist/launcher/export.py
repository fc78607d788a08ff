"""``tfdist-launch --export``: the same job, written for a cluster scheduler instead of run here.

Three formats, each describing the cluster that `tfdist.launcher.plan.plan_job` would start
locally (same roles, same counts, same environment):

* ``kubeflow``: a Kubeflow ``TFJob`` (``kubeflow.org/v1``). The training operator sets each
  pod's TF_CONFIG; ParameterServer ``Worker``/``PS`` replicas run ``python -m tfdist.server``.
* ``mpijob``: a Kubeflow ``MPIJob`` (``kubeflow.org/v2beta1``) for Horovod: a launcher pod runs
  ``horovodrun --gloo`` over the operator's hostfile; worker pods run sshd.
* ``slurm``: a batch script. ``srun`` starts one Slurm task per TensorFlow task, each through
  ``python -m tfdist.launcher.slurm_task``, which builds its TF_CONFIG from Slurm's variables.

Example:
    >>> from tfdist.launcher.plan import JobOptions
    >>> print(export_job(JobOptions("train.py", workers=2), "slurm", nodes=2).splitlines()[2])
    #SBATCH --job-name=train
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
from pathlib import PurePath
from typing import Any

from tfdist import compat
from tfdist.errors import MissingDependencyError, StrategyConfigError, format_error
from tfdist.launcher.plan import STRATEGY_ENV, JobOptions, resolve_strategy
from tfdist.strategies.registry import SINGLE_PROCESS_STRATEGIES

__all__ = ["EXPORT_FORMATS", "ExportOptions", "add_export_arguments", "export_job", "job_roles"]

EXPORT_FORMATS = ("kubeflow", "mpijob", "slurm")
MPI_HOSTFILE = "/etc/mpi/hostfile"  # written by the MPI Operator v2 into the launcher pod
TF_PORT = 2222  # the Kubeflow training operator's default TFJob port
_KUBEFLOW_ROLES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """Scheduler settings that a local run does not need.

    Attributes:
        image: Container image for Kubernetes formats (it must hold tfdist and the script).
        name: Job name; default: the script's file name, made DNS-safe.
        nodes: Slurm nodes to spread the tasks over.
        slots_per_worker: Horovod ranks per MPIJob worker pod.
        python: The Python executable inside the container or on the nodes.
    """

    image: str = "tfdist:latest"
    name: str | None = None
    nodes: int = 1
    slots_per_worker: int = 1
    python: str = "python"


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ``export`` argument group to ``tfdist-launch``'s parser."""
    group = parser.add_argument_group("export (write a scheduler job instead of running)")
    group.add_argument("--export", choices=EXPORT_FORMATS,
                       help="print (or --output) a Kubeflow TFJob, an MPIJob, or a Slurm script")
    group.add_argument("--image", default="tfdist:latest",
                       help="container image for kubeflow/mpijob (default tfdist:latest)")
    group.add_argument("--output", help="write the export to this file instead of stdout")
    group.add_argument("--name", help="job name (default: the script's name)")
    group.add_argument("--nodes", type=int, default=1, help="slurm: nodes (default 1)")
    group.add_argument("--slots-per-worker", type=int, default=1,
                       help="mpijob: Horovod ranks per worker pod (default 1)")


def export_options_from_args(args: argparse.Namespace) -> ExportOptions:
    return ExportOptions(image=args.image, name=args.name, nodes=args.nodes,
                         slots_per_worker=args.slots_per_worker)


def job_roles(options: JobOptions) -> dict[str, int]:
    """Tasks per role of the job, as `plan_job` lays it out (Horovod: one ``worker`` per rank).

    Example:
        >>> job_roles(JobOptions("t.py", workers=2, ps=1, evaluator=True))
        {'chief': 1, 'worker': 2, 'ps': 1, 'evaluator': 1}
    """
    strategy = resolve_strategy(options)
    if strategy in SINGLE_PROCESS_STRATEGIES:
        return {"chief": 1}
    if strategy == "horovod":
        return {"worker": options.workers}
    chief = options.chief if options.chief is not None else strategy == "parameter_server"
    counts = {"chief": int(chief), "worker": options.workers, "ps": options.ps,
              "evaluator": int(options.evaluator)}
    return {role: count for role, count in counts.items() if count}


def job_env(strategy: str) -> dict[str, str]:
    """The variables every task gets (TF_CONFIG aside), independent of this machine."""
    env = {STRATEGY_ENV: strategy, "PYTHONUNBUFFERED": "1"}
    if compat.needs_tf_keras(strategy):
        env[compat.LEGACY_KERAS_ENV] = "1"
    return env


def job_name(options: JobOptions, export: ExportOptions) -> str:
    """A DNS-1123 name (Kubernetes' rule) from ``export.name`` or the script's file name.

    Example:
        >>> job_name(JobOptions("dir/My_Train.py"), ExportOptions())
        'my-train'
    """
    raw = export.name or PurePath(options.script).stem
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")[:63].strip("-")
    return name or "tfdist-job"


def _script_command(options: JobOptions, export: ExportOptions) -> list[str]:
    return [export.python, "-u", options.script, *options.script_args]


def _container(name: str, image: str, command: list[str], env: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "image": image, "command": command,
            "env": [{"name": k, "value": v} for k, v in env.items()]}


def tfjob(options: JobOptions, export: ExportOptions) -> dict[str, Any]:
    """A Kubeflow ``TFJob`` with one replica spec per role of the job."""
    strategy = _strategy_for(options, "kubeflow")
    env = job_env(strategy)
    specs = {}
    for role, count in job_roles(options).items():
        command = _script_command(options, export)
        if strategy == "parameter_server" and role in ("worker", "ps"):
            command = [export.python, "-u", "-m", "tfdist.server"]
        container = _container("tensorflow", export.image, command, env)  # name TFJob requires
        container["ports"] = [{"name": "tfjob-port", "containerPort": TF_PORT}]
        specs[_KUBEFLOW_ROLES[role]] = {
            "replicas": count, "restartPolicy": "OnFailure",
            "template": {"spec": {"containers": [container]}},
        }
    return {
        "apiVersion": "kubeflow.org/v1", "kind": "TFJob",
        "metadata": {"name": job_name(options, export)},
        # Running: once the chief succeeds, the still-serving PS/worker pods are deleted.
        "spec": {"runPolicy": {"cleanPodPolicy": "Running"}, "tfReplicaSpecs": specs},
    }


def mpijob(options: JobOptions, export: ExportOptions) -> dict[str, Any]:
    """A Kubeflow ``MPIJob`` (v2beta1): ``horovodrun --gloo`` over the operator's hostfile."""
    _strategy_for(options, "mpijob")
    ranks, slots = options.workers, export.slots_per_worker
    if slots < 1 or ranks % slots:
        raise StrategyConfigError(format_error(
            "MPIJob workers must hold the Horovod ranks evenly.",
            received=f"--workers {ranks} --slots-per-worker {slots}",
            expected="--slots-per-worker >= 1 dividing --workers",
            fix=f"use --slots-per-worker 1, or a divisor of {ranks}"))
    env = job_env("horovod")
    launcher = ["horovodrun", "-np", str(ranks), "--hostfile", MPI_HOSTFILE, "--gloo",
                *_script_command(options, export)]
    worker = ["/usr/sbin/sshd", "-De"]  # the launcher reaches workers over ssh

    def replica(count: int, container: dict[str, Any]) -> dict[str, Any]:
        return {"replicas": count, "template": {"spec": {"containers": [container]}}}

    return {
        "apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
        "metadata": {"name": job_name(options, export)},
        "spec": {
            "slotsPerWorker": slots,
            "runPolicy": {"cleanPodPolicy": "Running"},
            "mpiImplementation": "OpenMPI",
            "mpiReplicaSpecs": {
                "Launcher": replica(1, _container("launcher", export.image, launcher, env)),
                "Worker": replica(ranks // slots, _container("worker", export.image, worker, env)),
            },
        },
    }


def sbatch_script(options: JobOptions, export: ExportOptions) -> str:
    """A Slurm batch script: one ``srun`` task per TensorFlow task, through the tfdist shim."""
    strategy = _strategy_for(options, "slurm")
    roles = job_roles(options)
    ntasks, nodes = sum(roles.values()), export.nodes
    if not 1 <= nodes <= ntasks:
        raise StrategyConfigError(format_error(
            "Slurm nodes must be between 1 and the number of tasks.",
            received=f"--nodes {nodes} for {ntasks} task(s)", expected=f"1..{ntasks}",
            fix="lower --nodes, or add workers"))
    shim = [export.python, "-m", "tfdist.launcher.slurm_task", "--strategy", strategy,
            "--ps", str(roles.get("ps", 0))]
    if strategy not in SINGLE_PROCESS_STRATEGIES:
        shim += ["--chief"] * ("chief" in roles) + ["--evaluator"] * ("evaluator" in roles)
    done = ""
    if strategy == "parameter_server":  # the chief's end tells the servers to stop
        done = ' --done-file "${SLURM_SUBMIT_DIR:-.}/.tfdist-${SLURM_JOB_ID:-0}.done"'
    command = shlex.join(shim) + done + " -- " + shlex.join(_script_command(options, export))
    per_node = f"#SBATCH --ntasks-per-node={ntasks // nodes}\n" if ntasks % nodes == 0 else ""
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in job_env(strategy).items())
    summary = ", ".join(f"{role}={count}" for role, count in roles.items())
    return (
        "#!/bin/bash\n"
        f"# Written by tfdist-launch --export slurm: {strategy}, {summary}.\n"
        f"#SBATCH --job-name={job_name(options, export)}\n"
        f"#SBATCH --nodes={nodes}\n"
        f"#SBATCH --ntasks={ntasks}\n"
        f"{per_node}"
        "set -euo pipefail\n"
        f"{exports}"
        "# Each task's TF_CONFIG comes from SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE and\n"
        "# SLURM_PROCID (tfdist.cluster.ClusterSpec.from_slurm); a failing task stops the step.\n"
        f"srun --kill-on-bad-exit=1 --label {command}\n"
    )


def _strategy_for(options: JobOptions, fmt: str) -> str:
    strategy = resolve_strategy(options)
    if fmt == "mpijob" and options.strategy == "auto" and not options.ps:
        strategy = "horovod"
    if (fmt == "mpijob") != (strategy == "horovod"):
        fix = ("use --export mpijob for Horovod" if strategy == "horovod"
               else "add --strategy horovod, or use --export kubeflow or slurm")
        raise StrategyConfigError(format_error(
            f"--export {fmt} cannot describe a {strategy} job.",
            received=f"--export {fmt} with strategy {strategy}",
            expected="mpijob for horovod; kubeflow or slurm for the TensorFlow strategies",
            fix=fix))
    return strategy


def export_job(options: JobOptions, fmt: str, **export: Any) -> str:
    """The job as text in format ``fmt`` (YAML for Kubernetes, a bash script for Slurm).

    Args:
        options: The job, as for a local run.
        fmt: One of `EXPORT_FORMATS`.
        **export: Fields of `ExportOptions`.

    Raises:
        StrategyConfigError: An unknown format, or one that cannot describe this strategy.
        MissingDependencyError: ``kubeflow`` or ``mpijob`` without PyYAML (the ``export`` extra).

    Example:
        >>> import yaml
        >>> text = export_job(JobOptions("train.py", workers=2, ps=1), "kubeflow", image="me/t:1")
        >>> sorted(yaml.safe_load(text)["spec"]["tfReplicaSpecs"])
        ['Chief', 'PS', 'Worker']
    """
    settings = ExportOptions(**export)
    if fmt == "slurm":
        return sbatch_script(options, settings)
    if fmt not in EXPORT_FORMATS:
        raise StrategyConfigError(format_error(
            "Unknown export format.", received=repr(fmt), expected=", ".join(EXPORT_FORMATS),
            fix="pick one of them"))
    try:
        import yaml
    except ImportError as err:
        raise MissingDependencyError(format_error(
            f"--export {fmt} writes YAML, and PyYAML is not installed.",
            received=f"import yaml: {err}", expected="PyYAML (tfdist's 'export' extra)",
            fix="pip install 'tfdist[export]' (or: pip install pyyaml)")) from err

    document = tfjob(options, settings) if fmt == "kubeflow" else mpijob(options, settings)
    return yaml.safe_dump(document, sort_keys=False)


def run_export(args: argparse.Namespace, options: JobOptions) -> int:
    """``tfdist-launch --export``: print the export, or write it to ``--output``."""
    text = export_job(options, args.export, **dataclasses.asdict(export_options_from_args(args)))
    if args.output and not args.dry_run:
        with open(args.output, "w") as file:
            file.write(text)
        print(f"tfdist-launch: wrote {args.export} job to {args.output}")
    else:
        print(text, end="")
    return 0
