"""What every layer needs to know about a strategy, as data that imports no TensorFlow.

A strategy's traits say how a job of it is laid out and started: which roles its cluster has,
which tasks run the user's script and which run a TensorFlow server, whether it runs in one
process or is started by ``horovodrun``, which Keras flavours its ``model.fit`` trains with, and
the environment its tasks need. Each strategy class carries its traits (``cls.traits``); the
registry (`tfdist.core.registry.strategy_traits`) hands them to validation, the launcher,
the exports, the Slurm task shim and the test runner, none of which branch on a strategy's name.

Example:
    A strategy of your own declares its traits on its class::

        class MyMirrored(tfdist.MirroredStrategy):
            traits = dataclasses.replace(tfdist.MirroredStrategy.traits, keras=("tf_keras",))
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

from tfdist.core.flavour import LEGACY_KERAS_ENV, KerasFlavour, keras_flavour
from tfdist.errors import KerasCompatibilityError, format_error

__all__ = [
    "Launch",
    "TaskKind",
    "StrategyTraits",
    "SERVER_MODULE",
    "STRATEGY_ENV",
    "DEFAULT",
    "MIRRORED",
    "MULTI_WORKER",
    "PARAMETER_SERVER",
    "HOROVOD",
    "PIPELINE",
    "PIPELINE_STAGES_ENV",
    "PIPELINE_MICRO_BATCHES_ENV",
    "PIPELINE_SCHEDULE_ENV",
    "PIPELINE_CHUNKS_ENV",
    "PIPELINE_BATCH_NORM_ENV",
    "TENSOR",
    "TENSOR_SHARDS_ENV",
    "MESH_ENV",
    "ZERO_ENV",
    "MODEL_PARALLEL_ENV",
]

Launch = Literal["single_process", "tasks", "ranks"]
"""How a job's processes start: one process; one per TF task (each with its TF_CONFIG); or
Horovod/MPI ranks started by ``horovodrun`` (no TF_CONFIG)."""

TaskKind = Literal["main", "service", "sidecar"]
"""``main`` runs to completion; a ``service`` serves until the main tasks are done; a ``sidecar``
(the evaluator) may fail without stopping the job. See `tfdist.launcher.process.ProcessGroup`."""

SERVER_MODULE = "tfdist.server"
"""The module a server task runs (``python -m tfdist.server``) instead of the user's script."""

STRATEGY_ENV = "TFDIST_STRATEGY"
"""Set on every task to the strategy it was launched for, so ``get_strategy("auto")`` agrees."""

PIPELINE_STAGES_ENV = "TFDIST_PIPELINE_STAGES"
PIPELINE_MICRO_BATCHES_ENV = "TFDIST_PIPELINE_MICRO_BATCHES"
PIPELINE_SCHEDULE_ENV = "TFDIST_PIPELINE_SCHEDULE"
PIPELINE_CHUNKS_ENV = "TFDIST_PIPELINE_CHUNKS"
PIPELINE_BATCH_NORM_ENV = "TFDIST_PIPELINE_BATCH_NORM"
"""``--batch-norm``: what a pipeline does with BatchNormalization at M > 1 (``refuse``, or the
opt-in ``per_micro_batch``)."""
TENSOR_SHARDS_ENV = "TFDIST_TENSOR_SHARDS"
"""T for a hand-set environment without `MESH_ENV` (``tfdist-launch`` writes T in the mesh)."""
ZERO_ENV = "TFDIST_ZERO"
"""The ZeRO stage (1, 2, 3) of a ``multi_worker`` job (1, 2 of a ``pipeline`` or ``tensor``
job): ``tfdist-launch --zero`` writes it and ``get_strategy("multi_worker")``, ``"pipeline"``,
``"tensor"`` (or ``auto``) reads it (`tfdist.strategies.zero`, `tfdist.zero.data_axis`)."""
MODEL_PARALLEL_ENV = MappingProxyType({"TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "1"})
"""What a pipeline or tensor task gets unless its launcher's environment sets it: with oneDNN on
(TensorFlow's default on x86), large tensors come from a pool that grows in doubling regions and
never shrinks, so a process shows its high-water mark rounded up to a region; the pipeline
memory test's last stage (57M-parameter MLP, Adam) measured 594 MB against 475 for stage 0 in one
run of three (0.67 of one process), 482 in the others. With the system allocator a stage's
resident memory follows what it holds, which is the point of splitting the model."""
MESH_ENV = "TFDIST_MESH"
"""The job's mesh, ``"data=2,pipe=1,tensor=2"`` (`tfdist.parallel.mesh.Mesh.to_env`): written by
``tfdist-launch`` on every task of a strategy that takes ``--stages`` or ``--tensor``."""



def _no_entries() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclasses.dataclass(frozen=True)
class StrategyTraits:
    """How a strategy's job is laid out, started and checked.

    Attributes:
        launch: How its processes start (`Launch`).
        roles: The roles its cluster may have, in start order (``chief``, ``worker``, ``ps``,
            ``evaluator``). A single-process job is one ``chief`` task.
        required_roles: Roles the cluster must have, each with the reason.
        chief_by_default: Whether a job gets a chief unless asked otherwise.
        chief_required: Whether a job without a chief cannot work (``--no-chief`` is an error).
        server_roles: Roles whose tasks run ``python -m tfdist.server`` instead of the script.
        restarted_alone: Roles whose dead task is restarted alone while the job goes on.
        fatal_roles: Roles whose loss ends the job, each with the reason the launcher prints.
        keras: Keras flavours that train correctly under this strategy (``model.fit``, or
            `tfdist.fit` where Keras's own ``fit`` cannot drive it).
        keras_unsupported: Why the other flavour cannot train (shown in the error).
        env: Variables every task of the job needs (beside `STRATEGY_ENV` and TF_CONFIG).
        launch_options: Launcher options the strategy takes (``--stages``), each with the
            variable that carries it to the tasks (`MESH_ENV` for ``--tensor``: T travels in
            the mesh, which the launcher writes whole for every strategy taking it).
        tensor_default: T when ``--tensor`` is not given: 1, or ``"all"`` (every training
            process of a pipeline; the tensor strategy's).
        elastic: Whether a running job can change its number of tasks (``--min-workers``,
            ``--max-workers``: Horovod's elastic mode, `tfdist.launcher.horovodrun.elastic`).
        saves_on_sigterm: Whether its training tasks can save at the step they are in on
            SIGTERM and exit 75 (`tfdist.resilience.preemption`), which the launcher's messages say.

    Example:
        >>> PARAMETER_SERVER.task_kind("ps"), PARAMETER_SERVER.task_kind("chief")
        ('service', 'main')
        >>> MULTI_WORKER.needs_tf_keras, StrategyTraits(keras=("tf_keras",)).needs_tf_keras
        (False, True)
    """

    launch: Launch = "tasks"
    roles: tuple[str, ...] = ("chief", "worker", "evaluator")
    required_roles: Mapping[str, str] = dataclasses.field(default_factory=_no_entries)
    chief_by_default: bool = False
    chief_required: bool = False
    server_roles: tuple[str, ...] = ()
    restarted_alone: tuple[str, ...] = ()
    fatal_roles: Mapping[str, str] = dataclasses.field(default_factory=_no_entries)
    keras: tuple[KerasFlavour, ...] = ("keras3", "tf_keras")
    keras_unsupported: str = ""
    env: Mapping[str, str] = dataclasses.field(default_factory=_no_entries)
    launch_options: Mapping[str, str] = dataclasses.field(default_factory=_no_entries)
    tensor_default: Literal[1, "all"] = 1
    elastic: bool = False
    saves_on_sigterm: bool = False

    @property
    def single_process(self) -> bool:
        """Whether the job is one process (the devices of this machine), with no cluster."""
        return self.launch == "single_process"

    @property
    def needs_tf_keras(self) -> bool:
        """Whether ``model.fit`` needs tf-keras (``TF_USE_LEGACY_KERAS=1``) under the strategy."""
        return "keras3" not in self.keras

    def check_keras(self, strategy: str, flavour: KerasFlavour | None = None) -> None:
        """Raises if ``model.fit`` cannot train with the strategy under this Keras (`keras`).

        Args:
            strategy: The strategy's name, for the message.
            flavour: The Keras in use (default: this process's, `tfdist.core.flavour`).

        Raises:
            KerasCompatibilityError: The pair is known not to work; the message names the fix.

        Example:
            >>> PARAMETER_SERVER.check_keras("parameter_server", "keras3")
            >>> StrategyTraits(keras=("tf_keras",)).check_keras("mine", "keras3")
            Traceback (most recent call last):
            ...
            tfdist.errors.KerasCompatibilityError: ...
        """
        flavour = flavour or keras_flavour()
        if flavour in self.keras:
            return
        if flavour == "keras3":
            raise KerasCompatibilityError(
                format_error(
                    f"Strategy {strategy!r} cannot train with Keras 3: {self.keras_unsupported}.",
                    received=f"strategy={strategy!r} with Keras 3 (TF_USE_LEGACY_KERAS unset)",
                    expected="tf-keras for this strategy",
                    fix="set TF_USE_LEGACY_KERAS=1 before TensorFlow is imported (tfdist-launch "
                    "does this for you) and build the model with `import tf_keras as keras` "
                    "(or tfdist.core.flavour.get_keras()); or use strategy='horovod', which "
                    "works with Keras 3",
                )
            )
        raise KerasCompatibilityError(
            format_error(
                f"Strategy {strategy!r} cannot train with tf-keras: {self.keras_unsupported}.",
                received=f"strategy={strategy!r} with tf-keras (TF_USE_LEGACY_KERAS=1)",
                expected="Keras 3 for this strategy",
                fix="unset TF_USE_LEGACY_KERAS and build the model with `import keras`",
            )
        )

    def has_role(self, role: str) -> bool:
        """Whether the strategy's cluster may have ``role`` tasks."""
        return role in self.roles

    @property
    def training_roles(self) -> tuple[str, ...]:
        """The roles whose tasks run the training script to the end (`task_kind` ``main``)."""
        return tuple(role for role in self.roles if self.task_kind(role) == "main")

    def chief(self, requested: bool | None) -> bool:
        """Whether the job has a chief: ``requested``, or the strategy's default when None."""
        return self.chief_by_default if requested is None else requested

    def task_kind(self, role: str) -> TaskKind:
        """How a ``role`` task behaves in a job (see `TaskKind`)."""
        if role in self.server_roles:
            return "service"
        return "sidecar" if role == "evaluator" else "main"

    def task_argv(self, role: str, script_argv: tuple[str, ...],
                  python: str = sys.executable, script_serves: bool = False) -> tuple[str, ...]:
        """What a ``role`` task runs: ``python -u -m tfdist.server`` for a server role, else
        ``python -u`` and the script with its arguments.

        ``script_serves``: the script runs on server roles too, and serves them itself (a script
        written from TensorFlow's guide: ``tf.distribute.Server(...).join()``).

        Example:
            >>> PARAMETER_SERVER.task_argv("ps", ("train.py",), python="python")
            ('python', '-u', '-m', 'tfdist.server')
            >>> PARAMETER_SERVER.task_argv("chief", ("train.py", "--epochs", "2"), python="py")
            ('py', '-u', 'train.py', '--epochs', '2')
            >>> PARAMETER_SERVER.task_argv("ps", ("train.py",), python="py", script_serves=True)
            ('py', '-u', 'train.py')
        """
        if role in self.server_roles and not script_serves:
            return (python, "-u", "-m", SERVER_MODULE)
        return (python, "-u", *script_argv)

    def task_env(self, strategy: str, environ: Mapping[str, str]) -> dict[str, str]:
        """The variables a task of this strategy gets, given the launcher's ``environ``.

        A user's own value of a variable in ``env`` is kept. So is their ``TF_USE_LEGACY_KERAS``
        (and carried, so that an exported job trains with the same Keras); else it is set to 1
        where the strategy needs tf-keras.

        Example:
            >>> MULTI_WORKER.task_env("multi_worker", {})
            {'TFDIST_STRATEGY': 'multi_worker'}
            >>> MULTI_WORKER.task_env("multi_worker", {"TF_USE_LEGACY_KERAS": "1"})
            {'TFDIST_STRATEGY': 'multi_worker', 'TF_USE_LEGACY_KERAS': '1'}
            >>> StrategyTraits(keras=("tf_keras",)).task_env("mine", {})
            {'TFDIST_STRATEGY': 'mine', 'TF_USE_LEGACY_KERAS': '1'}
            >>> PIPELINE.task_env("pipeline", {"TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "0"})
            {'TFDIST_STRATEGY': 'pipeline', 'TF_ONEDNN_USE_SYSTEM_ALLOCATOR': '0'}
        """
        env = {STRATEGY_ENV: strategy, **{k: environ.get(k, v) for k, v in self.env.items()}}
        if LEGACY_KERAS_ENV in environ:
            env[LEGACY_KERAS_ENV] = environ[LEGACY_KERAS_ENV]
        elif self.needs_tf_keras:
            env[LEGACY_KERAS_ENV] = "1"
        return env


DEFAULT = StrategyTraits(launch="single_process", roles=("chief",))
MIRRORED = DEFAULT

MULTI_WORKER = StrategyTraits(saves_on_sigterm=True,
                              launch_options=MappingProxyType({"zero": ZERO_ENV}))
"""Both Kerases: Keras 3's ``model.fit`` with tfdist's shims (`tfdist.compat.KERAS3_SHIMS`).
``--zero 1|2|3`` shards the optimizer state, gradients and weights (Keras 3 only)."""

PARAMETER_SERVER = StrategyTraits(
    roles=("chief", "worker", "ps", "evaluator"),
    required_roles=MappingProxyType({"ps": "it holds the variables",
                                     "chief": "it is the coordinator"}),
    chief_by_default=True,
    chief_required=True,
    server_roles=("worker", "ps"),
    restarted_alone=("worker",),
    fatal_roles=MappingProxyType({"ps": "parameter-server loss is fatal; its variables are gone"}),
)
"""Both Kerases: tf-keras's ``model.fit`` drives the coordinator; Keras 3's cannot (keras#18624),
so tfdist's shim routes it to a ``ClusterCoordinator`` loop (`tfdist.coordinator_fit`)."""

HOROVOD = StrategyTraits(launch="ranks", roles=("worker",), elastic=True)

PIPELINE = StrategyTraits(
    roles=("chief", "worker"),
    saves_on_sigterm=True,
    env=MODEL_PARALLEL_ENV,
    launch_options=MappingProxyType({"stages": PIPELINE_STAGES_ENV,
                                     "micro_batches": PIPELINE_MICRO_BATCHES_ENV,
                                     "schedule": PIPELINE_SCHEDULE_ENV,
                                     "chunks": PIPELINE_CHUNKS_ENV,
                                     "batch_norm": PIPELINE_BATCH_NORM_ENV,
                                     "tensor": MESH_ENV,
                                     "zero": ZERO_ENV}),
)
"""``--tensor T`` splits each stage over T processes (a ``data x pipe x tensor`` mesh);
``--zero 1|2`` shards each stage's optimizer state (and gradients) over its D replicas."""

TENSOR = StrategyTraits(
    roles=("chief", "worker"),
    keras=("keras3",),
    keras_unsupported="its split layers subclass Keras 3's Dense, Embedding and "
    "MultiHeadAttention",
    launch_options=MappingProxyType({"tensor": MESH_ENV, "zero": ZERO_ENV}),
    tensor_default="all",
    saves_on_sigterm=True,
    env=MODEL_PARALLEL_ENV,
)
"""Keras 3 only: the split layers (`tfdist.tensor.layers`) subclass Keras 3's layers.
``--zero 1|2`` shards each shard's optimizer state (and gradients) over its D replicas."""
