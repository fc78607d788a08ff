"""``tfdist-launch --export``: the same job, written for a cluster scheduler instead of run here.

Three formats, each written from the same `tfdist.launcher.plan.JobPlan` that a local run
places (same roles, same counts, same commands, same environment):

* ``kubeflow``: a Kubeflow ``TFJob`` (``kubeflow.org/v1``). The training operator sets each
  pod's TF_CONFIG; server roles (ParameterServer ``Worker``/``PS``) run
  ``python -m tfdist.server``.
* ``mpijob``: a Kubeflow ``MPIJob`` (``kubeflow.org/v2beta1``) for Horovod: a launcher pod runs
  ``horovodrun --gloo`` over the operator's hostfile; worker pods run sshd.
* ``slurm``: a batch script. ``srun`` starts one Slurm task per TensorFlow task (or Horovod
  rank), each through ``python -m tfdist.launcher.slurm.task``, which builds its TF_CONFIG (or
  its Horovod variables) from Slurm's. For Horovod the ``srun`` line runs inside
  ``python -m tfdist.launcher.slurm.horovod``, which serves Gloo's rendezvous beside it.

The Slurm script is run by a real ``slurmctld``/``slurmd`` in ``tests/slurm``; the Kubernetes
documents are validated against the Kubeflow TFJob and MPIJob schemas
(``tests/unit/test_export_schemas.py``), not run.

Example:
    >>> from tfdist.launcher.plan import JobOptions, plan_job
    >>> plan = plan_job(JobOptions("train.py", workers=2))
    >>> print(export_job(plan, "slurm", nodes=2).splitlines()[2])
    #SBATCH --job-name=train
"""

from __future__ import annotations

import re
import shlex
from pathlib import PurePath
from typing import Any

from tfdist.errors import MissingDependencyError, StrategyConfigError, format_error
from tfdist.launcher.options import EXPORT_FORMATS, ExportOptions
from tfdist.launcher.plan import JobPlan

__all__ = ["EXPORT_FORMATS", "ExportOptions", "export_job", "export_text", "run_export"]

MPI_HOSTFILE = "/etc/mpi/hostfile"  # written by the MPI Operator v2 into the launcher pod
TF_PORT = 2222  # the Kubeflow training operator's default TFJob port
_KUBEFLOW_ROLES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}


def job_name(plan: JobPlan, export: ExportOptions) -> str:
    """A DNS-1123 name (Kubernetes' rule) from ``export.name`` or the script's file name.

    Example:
        >>> from tfdist.launcher.plan import JobOptions, plan_job
        >>> job_name(plan_job(JobOptions("dir/My_Train.py")), ExportOptions())
        'my-train'
    """
    raw = export.name or PurePath(plan.options.script).stem
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")[:63].strip("-")
    return name or "tfdist-job"


def _container(name: str, image: str, command: list[str], env: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "image": image, "command": command,
            "env": [{"name": k, "value": v} for k, v in env.items()]}


def _image_env(plan: JobPlan) -> dict[str, str]:
    """The job's variables for a container: without PYTHONPATH, whose directories (the start-up
    hook's, `tfdist.startup_hook`) are this machine's paths, not the image's."""
    return {k: v for k, v in plan.env.items() if k != "PYTHONPATH"}


def tfjob(plan: JobPlan, export: ExportOptions) -> dict[str, Any]:
    """A Kubeflow ``TFJob`` with one replica spec per role of the job."""
    _check_format(plan, "kubeflow")
    specs = {}
    for role, count in plan.roles.items():
        command = list(plan.task_argv(role, export.python))
        # "tensorflow": the container name TFJob requires
        container = _container("tensorflow", export.image, command, _image_env(plan))
        container["ports"] = [{"name": "tfjob-port", "containerPort": TF_PORT}]
        specs[_KUBEFLOW_ROLES[role]] = {
            "replicas": count, "restartPolicy": "OnFailure",
            "template": {"spec": {"containers": [container]}},
        }
    return {
        "apiVersion": "kubeflow.org/v1", "kind": "TFJob",
        "metadata": {"name": job_name(plan, export)},
        # Running: once the chief succeeds, the still-serving PS/worker pods are deleted.
        "spec": {"runPolicy": {"cleanPodPolicy": "Running"}, "tfReplicaSpecs": specs},
    }


def mpijob(plan: JobPlan, export: ExportOptions) -> dict[str, Any]:
    """A Kubeflow ``MPIJob`` (v2beta1): ``horovodrun --gloo`` (``--mpi`` with ``--mpi``) over the
    operator's hostfile."""
    _check_format(plan, "mpijob")
    ranks, slots = plan.roles["worker"], export.slots_per_worker
    if slots < 1 or ranks % slots:
        raise StrategyConfigError(format_error(
            "MPIJob workers must hold the Horovod ranks evenly.",
            received=f"--workers {ranks} --slots-per-worker {slots}",
            expected="--slots-per-worker >= 1 dividing --workers",
            fix=f"use --slots-per-worker 1, or a divisor of {ranks}"))
    env = _image_env(plan)
    controller = "--mpi" if plan.options.mpi else "--gloo"
    launcher = ["horovodrun", "-np", str(ranks), "--hostfile", MPI_HOSTFILE, controller,
                *plan.task_argv("worker", export.python)]
    worker = ["/usr/sbin/sshd", "-De"]  # the launcher reaches workers over ssh

    def replica(count: int, container: dict[str, Any]) -> dict[str, Any]:
        return {"replicas": count, "template": {"spec": {"containers": [container]}}}

    return {
        "apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
        "metadata": {"name": job_name(plan, export)},
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


def sbatch_script(plan: JobPlan, export: ExportOptions) -> str:
    """A Slurm batch script: one ``srun`` task per TensorFlow task, through the tfdist shim."""
    _check_format(plan, "slurm")
    if plan.options.mpi:
        raise StrategyConfigError(format_error(
            "Horovod ranks under srun talk over Gloo; the Slurm export cannot start them with MPI.",
            received="--export slurm with --mpi", expected="--export slurm without --mpi",
            fix="drop --mpi (the ranks use Gloo), or use --export mpijob --mpi"))
    strategy, roles = plan.strategy, plan.roles
    ntasks, nodes = sum(roles.values()), export.nodes
    if not 1 <= nodes <= ntasks:
        raise StrategyConfigError(format_error(
            "Slurm nodes must be between 1 and the number of tasks.",
            received=f"--nodes {nodes} for {ntasks} task(s)", expected=f"1..{ntasks}",
            fix="lower --nodes, or add workers"))
    srun = _srun_line(plan, export)
    per_node = f"#SBATCH --ntasks-per-node={ntasks // nodes}\n" if ntasks % nodes == 0 else ""
    exports = "".join(_export_line(k, v) for k, v in plan.env.items())
    summary = ", ".join(f"{role}={count}" for role, count in roles.items())
    return (
        "#!/bin/bash\n"
        f"# Written by tfdist-launch --export slurm: {strategy}, {summary}.\n"
        f"#SBATCH --job-name={job_name(plan, export)}\n"
        f"#SBATCH --nodes={nodes}\n"
        f"#SBATCH --ntasks={ntasks}\n"
        f"{per_node}"
        "set -euo pipefail\n"
        f"{exports}"
        "# Each task's place comes from SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE, SLURMD_NODENAME\n"
        "# and SLURM_LOCALID (any --distribution works); a failing task stops the step.\n"
        f"{srun}\n"
    )


def _export_line(name: str, value: str) -> str:
    """One ``export`` of the batch script. ``PYTHONPATH`` keeps the submitter's own entries after
    the job's (sbatch passes the submitting shell's environment to the job), so a module the user
    put on their path is still found.

    Example:
        >>> print(_export_line("PYTHONPATH", "/hook"), end="")
        export PYTHONPATH=/hook${PYTHONPATH:+:$PYTHONPATH}
    """
    if name == "PYTHONPATH":
        return f"export PYTHONPATH={shlex.quote(value)}${{PYTHONPATH:+:$PYTHONPATH}}\n"
    return f"export {name}={shlex.quote(value)}\n"


def _srun_line(plan: JobPlan, export: ExportOptions) -> str:
    """The batch script's ``srun`` line: every task through the ``slurm_task`` shim."""
    roles = plan.roles
    shim = [export.python, "-m", "tfdist.launcher.slurm.task", "--strategy", plan.strategy,
            "--ps", str(roles.get("ps", 0))]
    if not plan.traits.single_process:
        shim += ["--chief"] * ("chief" in roles) + ["--evaluator"] * ("evaluator" in roles)
        shim += ["--script-on-all-tasks"] * plan.options.script_on_all_tasks
    done = ""
    if plan.traits.server_roles:  # servers serve forever: the chief's end tells them to stop
        done = ' --done-file "${SLURM_SUBMIT_DIR:-.}/.tfdist-${SLURM_JOB_ID:-0}.done"'
    command = shlex.join(shim) + done + " -- " + shlex.join(plan.task_argv("chief", export.python))
    srun = f"srun --kill-on-bad-exit=1 --label {command}"
    if plan.traits.launch == "ranks":  # Gloo's rendezvous, served on this node beside srun
        srun = f"{export.python} -m tfdist.launcher.slurm.horovod -- {srun}"
    return srun


def _check_format(plan: JobPlan, fmt: str) -> None:
    """MPIJob runs Horovod ranks; TFJob runs TF tasks or one process; Slurm runs either."""
    ranks = plan.traits.launch == "ranks"
    if fmt == "slurm" or (fmt == "mpijob") == ranks:
        return
    fix = (f"use --export mpijob or slurm for Horovod ranks ({plan.strategy})" if ranks
           else "add --strategy horovod, or use --export kubeflow or slurm")
    raise StrategyConfigError(format_error(
        f"--export {fmt} cannot describe a {plan.strategy} job.",
        received=f"--export {fmt} with strategy {plan.strategy}",
        expected="mpijob or slurm for Horovod ranks; kubeflow or slurm for TensorFlow tasks",
        fix=fix))


def export_job(plan: JobPlan, fmt: str, **export: Any) -> str:
    """The job as text in format ``fmt`` (YAML for Kubernetes, a bash script for Slurm).

    Args:
        plan: The job, as for a local run.
        fmt: One of `EXPORT_FORMATS`.
        **export: Fields of `ExportOptions` (its ``format`` is ``fmt``).

    Raises:
        StrategyConfigError: An unknown format, or one that cannot describe this strategy.
        MissingDependencyError: ``kubeflow`` or ``mpijob`` without PyYAML (the ``export`` extra).

    Example:
        >>> import yaml
        >>> from tfdist.launcher.plan import JobOptions, plan_job
        >>> plan = plan_job(JobOptions("train.py", workers=2, ps=1))
        >>> text = export_job(plan, "kubeflow", image="me/t:1")
        >>> sorted(yaml.safe_load(text)["spec"]["tfReplicaSpecs"])
        ['Chief', 'PS', 'Worker']
    """
    return export_text(plan, ExportOptions(format=fmt, **export))


def export_text(plan: JobPlan, settings: ExportOptions) -> str:
    """The job as text in ``settings.format`` (see `export_job`)."""
    fmt = settings.format
    if fmt == "slurm":
        return sbatch_script(plan, settings)
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

    document = tfjob(plan, settings) if fmt == "kubeflow" else mpijob(plan, settings)
    return yaml.safe_dump(document, sort_keys=False)


def run_export(plan: JobPlan, *, dry_run: bool = False) -> int:
    """``tfdist-launch --export``: print ``plan.options.export``, or write it to its ``output``
    (printed instead with ``dry_run``)."""
    export = plan.options.export
    if export is None:
        raise ValueError("run_export needs a plan with export options (tfdist-launch --export)")
    text = export_text(plan, export)
    if export.output and not dry_run:
        try:
            with open(export.output, "w") as file:
                file.write(text)
        except OSError as err:
            raise StrategyConfigError(format_error(
                f"Cannot write the {export.format} job to --output.", received=repr(export.output),
                expected="a file path that can be written", fix=f"fix the path ({err.strerror})"
            )) from err
        print(f"tfdist-launch: wrote {export.format} job to {export.output}")
    else:
        print(text, end="")
    return 0
