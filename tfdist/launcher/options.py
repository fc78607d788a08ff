"""What ``tfdist-launch`` was asked for, typed: the options `tfdist.launcher.plan.plan_job` decides.

The command line (`tfdist.launcher.arguments`) is parsed once into these; nothing after parsing
reads an ``argparse`` namespace. ``strategy="auto"`` and ``workers=None`` stay as asked: the plan
resolves them, once.

Example:
    >>> options = JobOptions("train.py", workers=4, strategy_options=StrategyOptions(stages=2))
    >>> options.strategy_options.given()
    {'stages': 2}
    >>> ExportOptions("slurm", nodes=2).nodes
    2
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from tfdist.launcher.hosts.layout import HostOptions
from tfdist.launcher.ray.options import RayOptions

__all__ = ["EXPORT_FORMATS", "ExportOptions", "JobOptions", "StrategyOptions"]

EXPORT_FORMATS = ("kubeflow", "mpijob", "slurm")


@dataclasses.dataclass(frozen=True)
class StrategyOptions:
    """Options of the strategy itself, among its ``traits.launch_options``.

    Each keeps its type here; the plan writes it into the tasks' environment, in one place.

    Attributes:
        stages: ``--stages K``: pipeline stages, one process each (each T processes with
            ``tensor``).
        tensor: ``--tensor T``: tensor-parallel shards of each stage's layers, one process each;
            ``--workers`` is D x K x T (the job's mesh, `tfdist.launcher.mesh_plan`).
        micro_batches: ``--micro-batches M``: micro-batches per replica batch.
        schedule: ``--schedule``: a name of `tfdist.pipeline.schedule.SCHEDULES`.
        chunks: ``--chunks v``: model chunks per process (``--schedule interleaved``).
        batch_norm: ``--batch-norm``: ``"per_micro_batch"`` opts in to BatchNormalization
            with M > 1 (its statistics per micro-batch); ``"refuse"`` is the default.
        zero: ``--zero 1|2|3``: ZeRO stage of a ``multi_worker`` job (`tfdist.strategies.zero`),
            or 1|2 on the data axis of a ``pipeline`` job (`tfdist.zero.data_axis`).

    Example:
        >>> StrategyOptions(micro_batches=4, schedule="1f1b").given()
        {'micro_batches': 4, 'schedule': '1f1b'}
    """

    stages: int | None = None
    tensor: int | None = None
    micro_batches: int | None = None
    schedule: str | None = None
    chunks: int | None = None
    batch_norm: str | None = None
    zero: int | None = None

    def given(self) -> dict[str, int | str]:
        """The options that were given (not None), by name, in declaration order."""
        values = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        return {name: value for name, value in values.items() if value is not None}


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """``--export``: the job written for a scheduler instead of run here.

    Attributes:
        format: One of `EXPORT_FORMATS`.
        image: Container image for Kubernetes formats (it must hold tfdist and the script).
        name: Job name; default: the script's file name, made DNS-safe.
        nodes: Slurm nodes to spread the tasks over.
        slots_per_worker: Horovod ranks per MPIJob worker pod.
        python: The Python executable inside the container or on the nodes.
        output: Write the export to this file (None: print it).
    """

    format: str = "kubeflow"
    image: str = "tfdist:latest"
    name: str | None = None
    nodes: int = 1
    slots_per_worker: int = 1
    python: str = "python"
    output: str | None = None


@dataclasses.dataclass(frozen=True)
class JobOptions:
    """What the user asked for, after parsing (see `tfdist.launcher.cli`).

    Attributes:
        script: The training script.
        script_args: Its arguments.
        strategy: A strategy name, ``package.module:Class``, or ``"auto"``.
        workers: Worker tasks, or Horovod ranks (None: the strategy's default, 1 for a
            single-process strategy, else 2).
        ps: Parameter-server tasks.
        chief: Add a chief (None: the strategy's default).
        evaluator: Add a sidecar evaluator.
        timeout: Seconds before the whole job is stopped (None: no limit; a task's failure,
            its peers' start-up deadline and the strategies' step deadlines end a stuck job).
        evaluator_grace: Seconds the evaluator may run on after training is done.
        max_restarts: Gang restarts after a failure.
        worker_restarts: Restarts of each task whose role the strategy restarts alone.
        log_dir: Where each task's output is also written (None: nowhere).
        hosts: ``--hosts``/``--hostfile``: tasks on these machines (ssh).
        network: ``private``: a job on this machine alone runs in a network namespace with
            only loopback (`tfdist.launcher.local.netns`); ``host``: on this machine's network.
        startup_timeout: Seconds each task waits for its peers (``TFDIST_STARTUP_TIMEOUT``;
            None: the tasks' default, 600 s).
        strategy_options: Options of the strategy itself (``--stages 2``); each reaches the
            tasks as the variable its ``traits.launch_options`` names.
        preemption_grace: Seconds tasks get, after the launcher forwards a SIGTERM, to save and
            exit before they are SIGKILLed (`tfdist.resilience.preemption`).
        mpi: Horovod ranks talk over MPI (``horovodrun --mpi``: shared memory between ranks on
            one host) instead of Gloo.
        verbose: Print every line of every task, and each task's plan, as they come (default:
            the chief's output less TensorFlow's start-up chatter; `tfdist.launcher.output`).
        quiet: Leave tfdist's own info lines out of the tasks' output (`tfdist.logs`).
        script_on_all_tasks: Run the script on the strategy's server roles too (ParameterServer
            ``worker`` and ``ps``), instead of ``python -m tfdist.server``: for a script that
            serves them itself, as TensorFlow's guide writes it.
        min_workers: Elastic Horovod: the fewest ranks the job goes on with (None: not elastic;
            `tfdist.launcher.horovodrun.elastic`).
        max_workers: Elastic Horovod: the most ranks the job grows to.
        export: ``--export``: write the job for a scheduler (None: run it).
        ray: ``--ray``: run the job as a gang of Ray actors (None: not on Ray).
    """

    script: str
    script_args: tuple[str, ...] = ()
    strategy: str = "auto"
    workers: int | None = None
    ps: int = 0
    chief: bool | None = None
    evaluator: bool = False
    timeout: float | None = None
    evaluator_grace: float = 60.0
    max_restarts: int = 0
    worker_restarts: int = 3
    log_dir: str | None = None
    hosts: HostOptions | None = None
    network: Literal["private", "host"] = "private"
    startup_timeout: float | None = None
    strategy_options: StrategyOptions = StrategyOptions()
    preemption_grace: float = 25.0
    mpi: bool = False
    verbose: bool = False
    quiet: bool = False
    script_on_all_tasks: bool = False
    min_workers: int | None = None
    max_workers: int | None = None
    export: ExportOptions | None = None
    ray: RayOptions | None = None

    @property
    def elastic(self) -> bool:
        """Whether the job's size may change while it runs (``--min-workers``/``--max-workers``)."""
        return self.min_workers is not None or self.max_workers is not None
