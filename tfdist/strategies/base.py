"""What every tfdist strategy adds to its `tf.distribute.Strategy`, implemented once.

A tfdist strategy is a real `tf.distribute.Strategy` subclass (so ``strategy.scope()``,
``model.fit`` and ``strategy.run`` keep working) that also mixes in `TfdistStrategyMixin`. The mixin
answers the questions a training script asks the same way for every backend:

* where am I: `cluster`, `task_type`, `task_index`, `worker_index`, `is_chief`, `num_workers`;
* how big is a step: `num_replicas`, `global_batch_size`, `scale_learning_rate`;
* how do I feed it: `input_context`, `distribute_dataset` (each worker gets its own shard;
  `tfdist.strategies.input`);
* what does ``fit`` need: `callbacks`, `backup_callback`, `checkpoint_callback`;
* what do ``compile``/``fit``/``evaluate``/``predict`` mean here: `check_model_call`,
  `runs_locally` (`tfdist.strategies.model_calls`);
* how do I save once: `write_path`, `save_model`, `save_checkpoint`, `restore_checkpoint`
  (`tfdist.strategies.saving`).

A backend changes behaviour by overriding a few primitives, never by checking names:

* `num_workers`, `worker_index`, `is_chief`, `num_replicas`: where this process sits
  (defaults: from `cluster` and the task, TF's ``multi_worker_util`` rules);
* `_distribute_dataset_fn`: how a sharded ``dataset_fn`` becomes what ``fit`` takes
  (default: ``distribute_datasets_from_function``);
* `every_worker_saves`: whether a save is a collective every worker must join (True for
  MultiWorkerMirrored: non-chief workers write to a temporary directory that is then deleted) or a
  chief-only write (False: other workers skip it);
* `callbacks`: what ``fit`` must be given (default: nothing);
* `check_model_call`, `runs_locally`: which model calls are refused, and which ``evaluate``/
  ``predict`` run on this process alone (default: none; Keras runs them).

Single-host strategies (``default``, ``mirrored``) report `SINGLE_HOST_CLUSTER`: a one-worker
spec whose address is nominal (nothing listens on it; a `ClusterSpec` cannot be empty), with this
process as ``worker:0``: one worker, `worker_index` 0, the chief.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any, ClassVar

import tensorflow as tf

from tfdist.cluster import ClusterSpec, Task, read_tf_config
from tfdist.core.traits import StrategyTraits
from tfdist.errors import StrategyConfigError, format_error
from tfdist.strategies.autograph import exclude_tfdist
from tfdist.strategies.input import InputMixin
from tfdist.strategies.saving import SavingMixin

__all__ = [
    "TfdistStrategyMixin",
    "SINGLE_HOST_CLUSTER",
    "SINGLE_HOST_TASK",
    "cluster_resolver",
]

SINGLE_HOST_CLUSTER = ClusterSpec(worker=("localhost:2222",))
"""The `cluster` of a single-host strategy. Its address is nominal: nothing listens on it."""

SINGLE_HOST_TASK = Task("worker", 0)
"""The `task` of a single-host strategy."""


def cluster_resolver(
    cluster: ClusterSpec, task: Task
) -> tf.distribute.cluster_resolver.SimpleClusterResolver:
    """A TF cluster resolver for ``task`` of ``cluster`` (no evaluator; local GPUs counted).

    Example:
        >>> spec = ClusterSpec(worker=["localhost:2222", "localhost:2223"])
        >>> cluster_resolver(spec, Task("worker", 1)).cluster_spec().as_dict()
        {'worker': ['localhost:2222', 'localhost:2223']}
    """
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster.as_dict()),
        task_type=task.type,
        task_id=task.index,
        rpc_layer="grpc",
        num_accelerators={"GPU": len(tf.config.list_physical_devices("GPU"))},
    )


class TfdistStrategyMixin(InputMixin, SavingMixin):
    """The tfdist surface of a strategy. Mix it in before the `tf.distribute.Strategy` base.

    Subclasses call `_init_tfdist` at the end of ``__init__`` and set `name`.

    Example:
        >>> import tfdist.strategies
        >>> strategy = tfdist.strategies.get_strategy("default")
        >>> strategy.is_chief, strategy.num_workers, strategy.global_batch_size(32)
        (True, 1, 32)
    """

    name: ClassVar[str] = ""
    """The registry name (``"mirrored"``), used in messages and to check TF_CONFIG."""

    traits: ClassVar[StrategyTraits]
    """How a job of this strategy is laid out and started (`tfdist.core.traits`)."""

    per_rank_backups: ClassVar[bool] = False
    """Whether each process keeps its own ``BackupAndRestore`` directory (see `backup_callback`)."""

    every_worker_saves: ClassVar[bool] = False
    """Whether saving is a collective that every worker must join (see module docstring)."""

    collective_calls: ClassVar[tuple[str, ...]] = ()
    """Model methods (``"evaluate"``, ``"predict"``) that are collectives of every process
    under this strategy: called on one process alone, they fail (`explain_failed_call`)."""

    preemption_saves: ClassVar[bool] = False
    """Whether a SIGTERM makes training save at its current step
    (`tfdist.resilience.preemption`)."""

    _tfdist_cluster: ClusterSpec
    _tfdist_task: Task | None

    # ----------------------------------------------------------------- set-up
    @classmethod
    def _check_keras(cls) -> None:
        """Raises `KerasCompatibilityError` when this Keras cannot ``fit`` with this strategy."""
        cls.traits.check_keras(cls.name)

    @classmethod
    def _read_cluster(cls, tf_config: str | Mapping[str, Any] | None) -> tuple[ClusterSpec, Task]:
        """Reads and checks TF_CONFIG (None: the environment) for this strategy, before TF does.

        Raises:
            ClusterConfigError: TF_CONFIG is missing or invalid, or does not fit the strategy.
            StrategyConfigError: this process's role must not create this strategy.
        """
        cluster, task = read_tf_config(tf_config, strategy=cls.name)
        roles = cls.traits.training_roles
        if task.type not in roles:
            raise StrategyConfigError(
                format_error(
                    f"Strategy {cls.name!r} is not created on a {task.type!r} task.",
                    received=f"task {task}",
                    expected=f"a task of role {' or '.join(roles)}",
                    fix=cls._wrong_role_fix(task),
                )
            )
        return cluster, task

    @classmethod
    def _wrong_role_fix(cls, task: Task) -> str:
        if task.type == "evaluator":
            return "the evaluator runs alone: use get_strategy('default') (or 'auto') there"
        return "run this script on the training tasks only"

    def _init_tfdist(self, cluster: ClusterSpec | None = None, task: Task | None = None) -> None:
        """Records where this process sits; ``cluster=None`` means `SINGLE_HOST_CLUSTER`."""
        exclude_tfdist()  # tfdist's step code inside tf.function: as written, not AutoGraph's
        from tfdist.strategies import model_calls

        model_calls.install()
        if cluster is None:
            cluster, task = SINGLE_HOST_CLUSTER, SINGLE_HOST_TASK
        self._tfdist_cluster = cluster
        self._tfdist_task = task
        self._tfdist_managers: dict[str, tf.train.CheckpointManager] = {}
        if self.preemption_saves:  # batches the next input iterator skips (see _resume_input_at)
            self._tfdist_input_skip = tf.Variable(0, dtype=tf.int64, trainable=False)

    # ------------------------------------------------------ where this process sits
    @property
    def cluster(self) -> ClusterSpec:
        """The cluster this strategy trains on (`SINGLE_HOST_CLUSTER` on a single host)."""
        return self._tfdist_cluster

    @property
    def task(self) -> Task | None:
        """This process's task (``worker:1``; ``worker:0`` on a single host)."""
        return self._tfdist_task

    @property
    def task_type(self) -> str | None:
        """``"chief"``, ``"worker"``, ``"ps"`` or ``"evaluator"`` (a single host: ``"worker"``)."""
        return None if self._tfdist_task is None else self._tfdist_task.type

    @property
    def task_index(self) -> int:
        """This task's index within its role (0 on a single host)."""
        return 0 if self._tfdist_task is None else self._tfdist_task.index

    @property
    def num_workers(self) -> int:
        """How many processes compute gradients (chief + workers; 1 on a single host)."""
        return max(1, len(self._tfdist_cluster.chief) + len(self._tfdist_cluster.worker))

    @property
    def worker_index(self) -> int:
        """This process's position among the `num_workers` (chief: 0), as TF's ``id_in_cluster``."""
        task = self._tfdist_task
        if task is None or task.type == "chief":
            return 0
        if task.type == "worker":
            return len(self._tfdist_cluster.chief) + task.index
        return 0

    @property
    def is_chief(self) -> bool:
        """Whether this process writes checkpoints, the final model and summaries.

        The ``chief`` task if the cluster has one, else ``worker:0``; always True on a single host.
        """
        task = self._tfdist_task
        if task is None:
            return True
        if self._tfdist_cluster.chief:
            return task.type == "chief"
        return task.type == "worker" and task.index == 0

    @property
    def num_replicas(self) -> int:
        """Replicas whose gradients make one global step (TF's ``num_replicas_in_sync``)."""
        return int(self.num_replicas_in_sync)  # type: ignore[attr-defined]

    # ----------------------------------------------------------------- step size
    def global_batch_size(self, per_replica: int) -> int:
        """The global batch of one step: ``per_replica * num_replicas``.

        Example:
            >>> import tfdist.strategies
            >>> tfdist.strategies.get_strategy("default").global_batch_size(64)
            64
        """
        if isinstance(per_replica, bool) or not isinstance(per_replica, int) or per_replica < 1:
            raise StrategyConfigError(
                format_error(
                    "per_replica must be a positive int.",
                    received=repr(per_replica),
                    expected="an int >= 1",
                    fix="pass the batch size one replica processes, e.g. 32",
                )
            )
        return per_replica * self.num_replicas

    def scale_learning_rate(self, lr: float) -> float:
        """Linear scaling rule: ``lr * num_replicas`` (Goyal et al., 2017).

        A global batch ``num_replicas`` times larger averages as many gradients, so the step size
        grows by the same factor. Add a warm-up for large factors.

        Example:
            >>> import tfdist.strategies
            >>> tfdist.strategies.get_strategy("default").scale_learning_rate(0.1)
            0.1
        """
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or lr <= 0:
            raise StrategyConfigError(
                format_error(
                    "lr must be a positive number.",
                    received=repr(lr),
                    expected="a float > 0",
                    fix="pass the learning rate tuned for one replica, e.g. 0.01",
                )
            )
        return float(lr) * self.num_replicas

    # --------------------------------------------------------------------- model
    def build_model(self, model_or_fn: Any) -> Any:
        """The model this process trains: ``model_or_fn()`` built under `scope`.

        The one call that lets a script run unchanged under every strategy: data-parallel
        strategies build the whole model in their scope; ``pipeline`` builds only this process's
        stage (`tfdist.strategies.pipeline.PipelineStrategy.build_model`).

        Example:
            >>> import tfdist.strategies
            >>> keras = tfdist.core.flavour.get_keras()
            >>> strategy = tfdist.strategies.get_strategy("default")
            >>> model = strategy.build_model(
            ...     lambda: keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))
            >>> model.count_params()
            3
        """
        if hasattr(model_or_fn, "layers"):
            return model_or_fn
        with self.scope():  # type: ignore[attr-defined]
            return model_or_fn()

    def check_model_call(self, model: Any, method: str, call: Mapping[str, Any]) -> None:
        """Raises before ``model.<method>(**call)`` runs when, under this strategy, it would
        not mean what it says (`tfdist.strategies.model_calls`). Default: every call is fine.

        Args:
            model: A Keras 3 model made in this strategy's scope.
            method: ``"compile"``, ``"fit"``, ``"evaluate"`` or ``"predict"``.
            call: The call's arguments by name (``x``, ``validation_data``...).

        Example:
            >>> import tfdist.strategies
            >>> tfdist.strategies.get_strategy("default").check_model_call(None, "fit", {})
        """

    def model_call_scope(self, model: Any, method: str,
                         call: Mapping[str, Any]) -> contextlib.AbstractContextManager[Any]:
        """What ``model.<method>(**call)`` runs inside, after `check_model_call` accepted it
        (the model-parallel strategies: one shuffle seed for the job's array ``fit``).
        Default: nothing.

        Example:
            >>> import tfdist.strategies
            >>> with tfdist.strategies.get_strategy("default").model_call_scope(None, "fit", {}):
            ...     pass
        """
        del model, method, call
        return contextlib.nullcontext()

    def check_model_from_outside(self, model: Any, method: str,
                                 call: Mapping[str, Any]) -> None:
        """Raises before ``model.<method>(**call)`` runs on a model made outside any tfdist
        strategy's scope, called inside this strategy's scope or on the input its
        ``distribute_dataset`` made (`tfdist.strategies.model_calls`). Default: Keras decides
        (a data-parallel strategy's scope replicates such a model, or Keras refuses it).

        Example:
            >>> import tfdist.strategies
            >>> tfdist.strategies.get_strategy("default").check_model_from_outside(None, "fit", {})
        """

    def explain_failed_call(self, method: str, error: Exception) -> None:
        """Raises a clearer error than ``error`` (TensorFlow's, from ``model.<method>``) when a
        misuse explains it; returns otherwise (the caller re-raises ``error``).

        The misuse: a method of `collective_calls` called on some processes only (``if
        strategy.is_chief: model.evaluate(...)``). The others have ended, and TensorFlow says
        that their tasks "are unhealthy ... crashed", though they exited normally.

        Example:
            >>> import tfdist.strategies
            >>> tfdist.strategies.get_strategy("default").explain_failed_call("fit", None)
        """
        if method not in self.collective_calls or not isinstance(
                error, tf.errors.UnavailableError) or "unhealthy" not in str(error):
            return
        raise StrategyConfigError(format_error(
            f"model.{method} under {self.name} is a collective of all {self.num_workers} "
            "processes, and another one had ended (or failed) before joining it: was it "
            "called on one process alone (if strategy.is_chief: ...)?",
            received=f"model.{method} on {self.task}; TensorFlow's "
                     f"{type(error).__name__}: a peer's tasks 'are unhealthy'",
            expected=f"model.{method} called on every process",
            fix=f"call model.{method} on every process: each returns the whole model's "
                "result on the whole input")) from error

    def runs_locally(self, method: str, x: Any = None) -> bool:
        """Whether ``model.<method>(x)`` (``"evaluate"`` or ``"predict"``) runs on this process
        alone, the strategy set aside: the whole model on the whole input, no collective, the
        same result on every process (their weights are equal) and on the chief alone.
        Default: False (Keras runs it as the strategy distributes it).

        Example:
            >>> import tfdist.strategies
            >>> tfdist.strategies.get_strategy("default").runs_locally("predict")
            False
        """
        del method, x
        return False

    def callbacks(
        self, tensorboard: str | os.PathLike[str] | None = None, **tensorboard_options: Any
    ) -> list[Any]:
        """The Keras callbacks this backend needs in ``model.fit``, and optionally TensorBoard.

        Args:
            tensorboard: A log directory: add a ``TensorBoard`` writer there, on the chief only
                (`tfdist.strategies.tensorboard`). None: no writer.
            **tensorboard_options: Passed to ``TensorBoard`` (``histogram_freq``...).

        Example:
            >>> import tempfile, tfdist.strategies
            >>> strategy = tfdist.strategies.get_strategy("default")
            >>> strategy.callbacks()
            []
            >>> [type(c).__name__ for c in strategy.callbacks(tensorboard=tempfile.mkdtemp())]
            ['TensorBoard']
        """
        if tensorboard is None:
            return self._backend_callbacks()
        from tfdist.strategies.tensorboard import tensorboard_callback

        return [*self._backend_callbacks(),
                tensorboard_callback(self, tensorboard, **tensorboard_options)]

    def _backend_callbacks(self) -> list[Any]:
        """The callbacks this backend itself needs in ``fit`` (TF strategies need none)."""
        return []

    # ------------------------------------------------------------------- display
    def describe(self) -> str:
        """One line: name, task, workers, replicas.

        Example:
            >>> import tfdist.strategies
            >>> tfdist.strategies.get_strategy("default").describe()
            'default: single host, 1 worker(s), 1 replica(s) in sync, chief'
        """
        where = "single host" if self.cluster is SINGLE_HOST_CLUSTER else f"task {self.task}"
        chief = ", chief" if self.is_chief else ""
        return (
            f"{self.name}: {where}, {self.num_workers} worker(s), "
            f"{self.num_replicas} replica(s) in sync{chief}"
        )

