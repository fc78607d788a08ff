"""A job, decided once: `plan_job` turns what the user asked for into the `JobPlan` runners read.

`plan_job` (`JobOptions` -> `JobPlan`) is the one place that resolves ``auto``, reads the
strategy's traits and checks the asked tasks against them (`layout_problem`); it decides the
tasks per role, what each role runs, the environment every task gets, and how the job is run
(timeout, restarts, logs, hosts, export, Ray). No ports, no processes: the Kubeflow, MPIJob and
Slurm exports and the Ray runner read the plan alone, and `tfdist.launcher.placement` lays it out
as processes here or on ``--hosts``.

Example:
    >>> plan = plan_job(JobOptions("train.py", workers=2, ps=1))
    >>> plan.strategy, plan.roles
    ('parameter_server', {'chief': 1, 'worker': 2, 'ps': 1})
    >>> plan.task_argv("ps", python="python")
    ('python', '-u', '-m', 'tfdist.server')
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping

from tfdist.cluster import Task
from tfdist.cluster.roles import ROLES
from tfdist.core.detect import launch_strategy
from tfdist.core.registry import strategy_traits
from tfdist.core.traits import STRATEGY_ENV, StrategyTraits, TaskKind
from tfdist.errors import StrategyConfigError, TfdistError
from tfdist.launcher.horovodrun.elastic import elastic_problem
from tfdist.launcher.mesh_plan import (
    mesh_problem,
    option_fix,
    plan_mesh,
    training_processes,
)
from tfdist.launcher.options import JobOptions, StrategyOptions
from tfdist.logs import LOG_LEVEL_ENV, REPORT_ENV
from tfdist.parallel.mesh import MESH_ENV, Mesh
from tfdist.pipeline.config import PipelineConfig
from tfdist.pipeline.layout import check_processes
from tfdist.startup_hook import task_env as startup_hook_env
from tfdist.strategies.startup import STARTUP_TIMEOUT_ENV

__all__ = [
    "STRATEGY_ENV",
    "JobOptions",
    "JobPlan",
    "LayoutError",
    "plan_job",
    "layout_problem",
]


class LayoutError(StrategyConfigError):
    """The asked tasks do not fit the strategy (`layout_problem`'s message)."""


@dataclasses.dataclass(frozen=True)
class JobPlan:
    """One job, as every runner sees it: strategy, tasks per role, commands, environment.

    Attributes:
        strategy: The concrete strategy (``auto`` resolved).
        traits: Its traits (read from the registry once).
        roles: Tasks per role in start order (a single-process job: one ``chief``; Horovod: one
            ``worker`` per rank).
        script_argv: The script and its arguments.
        env: Variables every task gets (TF_CONFIG aside), independent of where it runs.
        options: What the user asked for (run settings, hosts, export, Ray), with its
            ``strategy`` and ``workers`` decided.
        mesh: The chief and workers as a ``data x pipe x tensor`` mesh, when ``--stages`` or
            ``--tensor`` shaped it (`tfdist.launcher.mesh_plan`); its shape is in ``env``.
    """

    strategy: str
    traits: StrategyTraits
    roles: Mapping[str, int]
    script_argv: tuple[str, ...]
    env: Mapping[str, str]
    options: JobOptions
    mesh: Mesh | None = None

    def tasks(self) -> list[Task]:
        """Every task of the job, in start order."""
        return [Task(role, i) for role, count in self.roles.items() for i in range(count)]

    def task_argv(self, role: str, python: str = sys.executable) -> tuple[str, ...]:
        """What a ``role`` task runs: the script, or ``python -m tfdist.server`` (traits)."""
        return self.traits.task_argv(role, self.script_argv, python,
                                     script_serves=self.options.script_on_all_tasks)

    def task_kind(self, role: str) -> TaskKind:
        return self.traits.task_kind(role)

    def restarts(self, role: str) -> int:
        """How many times a dead ``role`` task is restarted alone while the job goes on."""
        return self.options.worker_restarts if role in self.traits.restarted_alone else 0

    def loss_is_fatal(self, role: str) -> str | None:
        """Why losing a ``role`` task ends the job, where the strategy says it does."""
        return self.traits.fatal_roles.get(role)


def plan_job(options: JobOptions, environ: Mapping[str, str] | None = None) -> JobPlan:
    """Decides the job: strategy, traits, tasks per role, environment. Starts and binds nothing.

    Args:
        options: What the user asked for.
        environ: The launcher's environment (default ``os.environ``): a user's own
            ``TF_USE_LEGACY_KERAS`` and ``TF_CPP_MIN_LOG_LEVEL`` are kept.

    Raises:
        StrategyConfigError: The strategy is unknown.
        LayoutError: The asked tasks do not fit it (`layout_problem`).
    """
    environ = os.environ if environ is None else environ
    strategy = _resolve_strategy(options)
    traits = strategy_traits(strategy)
    workers = options.workers
    if workers is None:
        workers = 1 if traits.single_process else 2
    options = dataclasses.replace(options, strategy=strategy, workers=workers)
    problem = layout_problem(options, strategy, traits)
    if problem:
        raise LayoutError(problem)
    script_argv = (options.script, *options.script_args)
    mesh = plan_mesh(options, traits)
    env = _task_env(options, traits, environ)
    if mesh is not None:
        env[MESH_ENV] = mesh.to_env()
    return JobPlan(strategy, traits, _roles(options, traits), script_argv, env, options, mesh)


def _task_env(options: JobOptions, traits: StrategyTraits,
              environ: Mapping[str, str]) -> dict[str, str]:
    """The variables every task of the job gets (TF_CONFIG aside); the start-up hook's
    PYTHONPATH (`tfdist.startup_hook`) gives a script that never imports tfdist the Keras 3
    shims."""
    env = {
        **traits.task_env(options.strategy, environ),
        **startup_hook_env(environ),
        "PYTHONUNBUFFERED": "1",
        # TensorFlow's C++ INFO/WARNING lines drown the training output; set 0 to see them.
        "TF_CPP_MIN_LOG_LEVEL": environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
        # tfdist's own info lines and what a task wrote, for the launcher (`tfdist.logs`).
        LOG_LEVEL_ENV: "WARNING" if options.quiet else "INFO",
        REPORT_ENV: "1",
    }
    if options.startup_timeout is not None:
        env[STARTUP_TIMEOUT_ENV] = f"{options.startup_timeout:g}"
    env.update(strategy_env(options.strategy_options, traits))
    return env


def _resolve_strategy(options: JobOptions) -> str:
    """``auto`` for these counts (`launch_strategy`); any other name as given."""
    if options.strategy != "auto":
        return options.strategy
    ranks = options.export is not None and options.export.format == "mpijob"
    return launch_strategy(workers=2 if options.workers is None else options.workers,
                           ps=options.ps, ranks=ranks, stages=options.strategy_options.stages,
                           tensor=options.strategy_options.tensor)


def strategy_env(strategy_options: StrategyOptions, traits: StrategyTraits) -> dict[str, str]:
    """The variables that carry the strategy's own options to its tasks: those given, the
    pipeline's written by `PipelineConfig.env` (checked there), which the tasks'
    `PipelineConfig.from_env` reads back; any other as its value, but an option carried by the
    mesh (``--tensor``, in `tfdist.parallel.mesh.MESH_ENV`), which `plan_job` writes whole.

    Example:
        >>> from tfdist.core.traits import PIPELINE
        >>> strategy_env(StrategyOptions(stages=2, micro_batches=4), PIPELINE)
        {'TFDIST_PIPELINE_STAGES': '2', 'TFDIST_PIPELINE_MICRO_BATCHES': '4'}
    """
    given = strategy_options.given()
    pipeline = {option: value for option, value in given.items() if option in _PIPELINE_FIELDS}
    written = PipelineConfig(**pipeline).env() if pipeline else {}
    return {traits.launch_options[option]: written.get(traits.launch_options[option], str(value))
            for option, value in given.items() if traits.launch_options[option] != MESH_ENV}


_PIPELINE_FIELDS = frozenset(field.name for field in dataclasses.fields(PipelineConfig))


def layout_problem(options: JobOptions, strategy: str, traits: StrategyTraits) -> str | None:
    """What is wrong with the asked tasks for ``strategy``, as a one-line message, or None.

    ``options.workers`` is decided (`plan_job` passes the strategy's default for None).

    Example:
        >>> from tfdist.core.traits import HOROVOD
        >>> layout_problem(JobOptions("t.py", workers=2, evaluator=True), "horovod", HOROVOD)[:46]
        '--evaluator was given with --strategy horovod,'
    """
    problem = (_count_problem(options, strategy, traits)
               or _role_problem(options, strategy, traits)
               or _strategy_options_problem(options, strategy, traits)
               or _mpi_problem(options, strategy, traits)
               or elastic_problem(options, strategy, traits))
    if problem:
        return problem
    flags = {"evaluator": "--evaluator" if options.evaluator else None,
             "chief": "--chief" if options.chief and not traits.single_process else None}
    for role, flag in flags.items():
        if flag and not traits.has_role(role):
            return (f"{flag} was given with --strategy {strategy}, which has no {role} task. "
                    f"Fix: drop {flag}, or use a strategy with one (multi_worker, "
                    "parameter_server)")
    return None


def _count_problem(options: JobOptions, strategy: str, traits: StrategyTraits) -> str | None:
    assert options.workers is not None, "plan_job decides the workers first"
    if options.hosts is not None and traits.single_process:
        return (f"--strategy {strategy} runs one process on this machine; --hosts/--hostfile "
                "need a multi-process strategy. Fix: use multi_worker, parameter_server or horovod")
    if options.workers < 1:
        return f"--workers must be at least 1. Received: {options.workers}"
    if options.ps < 0:
        return f"--ps must be 0 or more. Received: {options.ps}"
    if traits.single_process and options.workers > 1:
        return (f"--strategy {strategy} runs one process (several devices in it), but "
                f"--workers {options.workers} was given. Fix: use --strategy multi_worker")
    return None


def _role_problem(options: JobOptions, strategy: str, traits: StrategyTraits) -> str | None:
    if options.ps and not traits.has_role("ps"):
        return (f"--ps {options.ps} was given with --strategy {strategy}, which has no parameter "
                f"servers. Fix: drop --ps, or use --strategy parameter_server")
    for role, why in traits.required_roles.items():
        if role == "ps" and not options.ps:
            return f"--strategy {strategy} needs --ps 1 or more ({why})"
    if options.chief is False and traits.chief_required:
        why = traits.required_roles.get("chief", "the job needs one")
        return f"--no-chief with {strategy}: {why}. Fix: drop --no-chief"
    if options.script_on_all_tasks and not traits.server_roles:
        return (f"--script-on-all-tasks was given with --strategy {strategy}, whose every task "
                "already runs the script. Fix: drop --script-on-all-tasks (it is for "
                "parameter_server scripts that serve their own worker and ps tasks)")
    return None


def _mpi_problem(options: JobOptions, strategy: str, traits: StrategyTraits) -> str | None:
    if not options.mpi:
        return None
    if traits.launch != "ranks":
        return (f"--mpi was given with --strategy {strategy}, whose tasks are not Horovod ranks. "
                "Fix: drop --mpi, or use --strategy horovod")
    return None


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def _strategy_options_problem(
    options: JobOptions, strategy: str, traits: StrategyTraits
) -> str | None:
    given = options.strategy_options.given()
    for option in given:
        if option not in traits.launch_options:
            takes = ", ".join(_flag(o) for o in traits.launch_options) or "none"
            return (f"{_flag(option)} was given with --strategy {strategy}, which does not take "
                    f"it (it takes: {takes}). Fix: {option_fix(option)}")
    stages = options.strategy_options.stages
    if stages is not None and options.strategy_options.tensor is None:
        processes = training_processes(options, traits)
        try:
            check_processes(processes, stages)
        except TfdistError as err:
            return f"--stages {stages} with {processes} process(es): {err}"
    return _zero_problem(options, strategy, traits) or mesh_problem(options, traits)


def _zero_problem(options: JobOptions, strategy: str, traits: StrategyTraits) -> str | None:
    """What is wrong with ``--zero`` for this job, as one line, or None: ZeRO shards over the
    D data-parallel processes (D = processes / (K x T) on a mesh), so D must be 2 or more;
    the pipeline (on whole stages) and the tensor strategy run stages 1 to 3."""
    zero = options.strategy_options.zero
    if zero is None:
        return None
    processes = training_processes(options, traits)
    try:
        mesh = plan_mesh(options, traits)
    except TfdistError:
        return None  # processes the mesh cannot hold: `mesh_problem` names them
    if mesh is None:
        if processes < 2:
            return (f"--zero {zero} with {processes} training process (D=1): ZeRO shards over "
                    "the data-parallel processes, and one has nothing to share. Fix: --workers 2 "
                    "or more, or drop --zero")
        return None
    if mesh.tensor > 1 and "stages" in traits.launch_options:  # the pipeline's stages
        return (f"--zero {zero} with --tensor {mesh.tensor}: ZeRO on the pipeline's data axis "
                "is not built for tensor-split stages. Fix: drop --tensor, or drop --zero")
    if mesh.data < 2:
        split = f"--stages {mesh.pipe}" if mesh.pipe > 1 else f"--tensor {mesh.tensor}"
        return (f"--zero {zero} with {processes} process(es) and {split} (D={mesh.data}): ZeRO "
                "shards over the data-parallel replicas, and one has nothing to share. Fix: "
                f"--workers {2 * mesh.pipe * mesh.tensor} (D=2), or drop --zero")
    return None


def _roles(options: JobOptions, traits: StrategyTraits) -> dict[str, int]:
    if traits.single_process:
        return {"chief": 1}
    assert options.workers is not None
    asked = {"chief": int(traits.chief(options.chief)), "worker": options.workers,
             "ps": options.ps, "evaluator": int(options.evaluator)}
    return {role: asked[role] for role in ROLES if asked[role] and traits.has_role(role)}
