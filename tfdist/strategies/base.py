"""What every tfdist strategy adds to its `tf.distribute.Strategy`, implemented once.

A tfdist strategy is a real `tf.distribute.Strategy` subclass (so ``strategy.scope()``,
``model.fit`` and ``strategy.run`` keep working) that also mixes in `TfdistStrategyMixin`. The mixin
answers the questions a training script asks the same way for every backend:

* where am I: `cluster`, `task_type`, `task_index`, `worker_index`, `is_chief`, `num_workers`;
* how big is a step: `num_replicas`, `global_batch_size`, `scale_learning_rate`;
* how do I feed it: `input_context`, `distribute_dataset` (each worker gets its own shard);
* what does ``fit`` need: `callbacks`, `backup_callback`, `checkpoint_callback`;
* how do I save once: `write_path`, `save_model`, `save_checkpoint`, `restore_checkpoint`.

A backend changes behaviour by overriding a few primitives, never by checking names:

* `num_workers`, `worker_index`, `is_chief`, `num_replicas`: where this process sits
  (defaults: from `cluster` and the task, TF's ``multi_worker_util`` rules);
* `_distribute_dataset_fn`: how a sharded ``dataset_fn`` becomes what ``fit`` takes
  (default: ``distribute_datasets_from_function``);
* `every_worker_saves`: whether a save is a collective every worker must join (True for
  MultiWorkerMirrored: non-chief workers write to a temporary directory that is then deleted) or a
  chief-only write (False: other workers skip it);
* `callbacks`: what ``fit`` must be given (default: nothing).

Single-host strategies (``default``, ``mirrored``) report `SINGLE_HOST_CLUSTER`: a one-worker
spec whose address is nominal (nothing listens on it; a `ClusterSpec` cannot be empty), with this
process as ``worker:0``: one worker, `worker_index` 0, the chief.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import tensorflow as tf

from tfdist import compat
from tfdist.cluster import ClusterSpec, Task, read_tf_config
from tfdist.core.traits import StrategyTraits
from tfdist.errors import StrategyConfigError, format_error

__all__ = [
    "TfdistStrategyMixin",
    "DatasetFn",
    "SINGLE_HOST_CLUSTER",
    "SINGLE_HOST_TASK",
    "shard_for",
    "cluster_resolver",
]

DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]
"""``dataset_fn(input_context) -> tf.data.Dataset``, the input contract of every strategy."""

_TEMP_PREFIX = ".tfdist-tmp-"

SINGLE_HOST_CLUSTER = ClusterSpec(worker=("localhost:2222",))
"""The `cluster` of a single-host strategy. Its address is nominal: nothing listens on it."""

SINGLE_HOST_TASK = Task("worker", 0)
"""The `task` of a single-host strategy."""


def shard_for(dataset: tf.data.Dataset, context: tf.distribute.InputContext) -> tf.data.Dataset:
    """Keeps the elements of ``dataset`` that belong to ``context``'s input pipeline.

    Element ``i`` goes to pipeline ``i % num_input_pipelines``. On a batched dataset this deals
    whole batches: with 2 workers, worker 0 gets batches 0, 2, 4... and worker 1 batches 1, 3, 5...,
    so the global batch of step ``k`` is batches ``2k`` and ``2k+1`` together.

    Example:
        >>> ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1)
        >>> [int(x) for x in shard_for(tf.data.Dataset.range(6), ctx)]
        [1, 3, 5]
    """
    if context.num_input_pipelines <= 1:
        return dataset
    return dataset.shard(context.num_input_pipelines, context.input_pipeline_id)


def _sharded(dataset_fn: DatasetFn) -> DatasetFn:
    def sharded_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        dataset = dataset_fn(context)
        if not isinstance(dataset, tf.data.Dataset):
            raise StrategyConfigError(
                format_error(
                    "dataset_fn must return a tf.data.Dataset.",
                    received=type(dataset).__name__,
                    expected="tf.data.Dataset",
                    fix="return tf.data.Dataset.from_tensor_slices(...).batch(...) from dataset_fn",
                )
            )
        return shard_for(dataset, context)

    return sharded_fn


def _resumable(dataset_fn: DatasetFn, skip: tf.Variable) -> DatasetFn:
    def resumable_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        from tfdist.preemption import skip_at_start

        return skip_at_start(dataset_fn(context), skip)

    return resumable_fn


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


class TfdistStrategyMixin:
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

    preemption_saves: ClassVar[bool] = False
    """Whether a SIGTERM makes training save at its current step (`tfdist.preemption`)."""

    _tfdist_cluster: ClusterSpec
    _tfdist_task: Task | None

    # ----------------------------------------------------------------- set-up
    @classmethod
    def _check_keras(cls) -> None:
        """Raises `KerasCompatibilityError` when this Keras cannot ``fit`` with this strategy."""
        compat.check_supported(cls.name, traits=cls.traits)

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

    # --------------------------------------------------------------------- input
    def input_context(self) -> tf.distribute.InputContext:
        """The `tf.distribute.InputContext` of this process's input pipeline.

        Example:
            >>> import tfdist.strategies
            >>> ctx = tfdist.strategies.get_strategy("default").input_context()
            >>> ctx.num_input_pipelines, ctx.input_pipeline_id
            (1, 0)
        """
        return tf.distribute.InputContext(
            num_input_pipelines=self.num_workers,
            input_pipeline_id=self.worker_index,
            num_replicas_in_sync=self.num_replicas,
        )

    def distribute_dataset(
        self, dataset_fn: DatasetFn, *, shard: bool = True, options: Any = None
    ) -> Any:
        """Builds each worker's input from ``dataset_fn(input_context)``, in what ``fit`` accepts.

        Args:
            dataset_fn: Returns the dataset of one worker. Batch it with
                ``input_context.get_per_replica_batch_size(global_batch)`` (or a per-replica
                size). It runs on every worker (on ParameterServer: on every ``worker`` task).
            shard: If True (default), the returned dataset is sharded by element with `shard_for`,
                so workers get disjoint elements (whole batches, if ``dataset_fn`` batches). Pass
                False when ``dataset_fn`` shards by itself with ``input_context``.
            options: ``tf.distribute.InputOptions`` passed through to TensorFlow.

        Returns:
            What ``model.fit`` takes for this backend: a `tf.distribute.DistributedDataset`
            for the in-graph strategies, a ``DatasetCreator`` for ParameterServer.

        Example:
            >>> import tfdist.strategies
            >>> strategy = tfdist.strategies.get_strategy("default")
            >>> def dataset_fn(ctx):
            ...     return tf.data.Dataset.range(8).batch(ctx.get_per_replica_batch_size(4))
            >>> [b.numpy().tolist() for b in strategy.distribute_dataset(dataset_fn)]
            [[0, 1, 2, 3], [4, 5, 6, 7]]
        """
        if not callable(dataset_fn):
            raise StrategyConfigError(
                format_error(
                    "distribute_dataset needs a function, not a dataset.",
                    received=type(dataset_fn).__name__,
                    expected="dataset_fn(input_context) -> tf.data.Dataset",
                    fix="wrap it: strategy.distribute_dataset(lambda ctx: dataset)",
                )
            )
        fn = _sharded(dataset_fn) if shard else dataset_fn
        if self.preemption_saves:
            fn = _resumable(fn, self._tfdist_input_skip)
        return self._distribute_dataset_fn(fn, options)

    def _resume_input_at(self, global_step: int) -> None:
        """Makes the next input iterator start where step ``global_step`` left the stream."""
        if self.preemption_saves:
            local_replicas = max(1, self.num_replicas // self.num_workers)
            self._tfdist_input_skip.assign(global_step * local_replicas)

    def _distribute_dataset_fn(self, dataset_fn: DatasetFn, options: Any) -> Any:
        distribute = self.distribute_datasets_from_function  # type: ignore[attr-defined]
        return distribute(dataset_fn, options)

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

    # -------------------------------------------------------------------- saving
    def backup_callback(self, directory: str | os.PathLike[str], **kwargs: Any) -> Any:
        """A Keras ``BackupAndRestore`` for ``model.fit`` that is safe under this backend.

        Pass the same ``directory`` on every process; a restarted job resumes from its last
        completed epoch. See `tfdist.strategies.backup` for how each backend lays it out.

        Example:
            >>> import tempfile, tfdist.strategies
            >>> strategy = tfdist.strategies.get_strategy("default")
            >>> callback = strategy.backup_callback(tempfile.mkdtemp())
            >>> type(callback).__name__
            'BackupAndRestore'
        """
        from tfdist.strategies.backup import backup_callback

        return backup_callback(self, directory, **kwargs)

    def preemption_handler(
        self, checkpoint: tf.train.Checkpoint, directory: str | os.PathLike[str]
    ) -> Any:
        """For a custom loop: saves ``checkpoint`` at the current step on SIGTERM, then exits 75.

        Creating it restores the latest checkpoint in ``directory``, and makes the next iterator
        over a `distribute_dataset` start where that step left the input; so create it before
        the iterator. Run each step as ``handler.run(train_step, next(iterator))``
        (one step per call); track the step in a variable of ``checkpoint``
        (`tfdist.preemption` says what happens on SIGTERM).

        Raises:
            StrategyConfigError: this strategy does not save on SIGTERM (`preemption_saves`).

        Example:
            >>> import tempfile, tfdist.strategies
            >>> strategy = tfdist.strategies.get_strategy("default")
            >>> strategy.preemption_handler(tf.train.Checkpoint(), tempfile.mkdtemp())
            Traceback (most recent call last):
            ...
            tfdist.errors.StrategyConfigError: This strategy cannot save ... Received: ...
        """
        from tfdist.preemption import preemption_handler

        return preemption_handler(self, checkpoint, os.fspath(directory))

    def checkpoint_callback(self, filepath: str | os.PathLike[str], **kwargs: Any) -> Any:
        """A Keras ``ModelCheckpoint`` that writes ``filepath`` once, from the chief.

        Pass it on every process (see `tfdist.strategies.backup.model_checkpoint_callback`).

        Example:
            >>> import tempfile, tfdist.strategies
            >>> strategy = tfdist.strategies.get_strategy("default")
            >>> callback = strategy.checkpoint_callback(tempfile.mkdtemp() + "/w.weights.h5",
            ...                                         save_weights_only=True)
            >>> type(callback).__name__
            'ModelCheckpoint'
        """
        from tfdist.strategies.backup import model_checkpoint_callback

        return model_checkpoint_callback(self, filepath, **kwargs)

    def write_path(self, path: str | os.PathLike[str]) -> str | None:
        """Where this process writes what belongs at ``path``.

        The chief writes ``path``. Under `every_worker_saves` (MultiWorkerMirrored), any other
        worker must also take part in the save, and writes to
        ``<dirname>/.tfdist-tmp-<task_type>-<index>/<basename>`` instead (the pattern of TF's
        multi-worker Keras tutorial); `save_model` and `save_checkpoint` delete it afterwards.
        Otherwise a non-chief gets None: it must not write.

        Example:
            >>> import tfdist.strategies
            >>> tfdist.strategies.get_strategy("default").write_path("/tmp/model.keras")
            '/tmp/model.keras'
        """
        path = os.fspath(path)
        if self.is_chief:
            return path
        if not self.every_worker_saves:
            return None
        tag = f"{_TEMP_PREFIX}{self.task_type}-{self.task_index}"
        head, tail = os.path.split(path.rstrip("/"))
        return os.path.join(head, tag, tail)

    def _discard(self, written: str) -> None:
        if self.is_chief:
            return
        temp_dir = os.path.dirname(written)
        if os.path.basename(temp_dir).startswith(_TEMP_PREFIX):
            shutil.rmtree(temp_dir, ignore_errors=True)

    def _writing(self) -> contextlib.AbstractContextManager[None]:
        """Context of a write that not every process makes (Horovod: no broadcasts inside)."""
        return contextlib.nullcontext()

    def save_model(self, model: Any, filepath: str | os.PathLike[str], **kwargs: Any) -> str | None:
        """Saves ``model`` once: to ``filepath`` on the chief (see `write_path` for the others).

        Call it on every process: under MultiWorkerMirrored the save is a collective.

        Args:
            model: A Keras model (either flavour).
            filepath: Passed to ``model.save`` (Keras 3 needs a ``.keras`` name).
            **kwargs: Passed to ``model.save``.

        Returns:
            ``filepath`` on the chief, None elsewhere.

        Example:
            >>> import tempfile, tfdist.strategies
            >>> keras = tfdist.core.flavour.get_keras()
            >>> strategy = tfdist.strategies.get_strategy("default")
            >>> with strategy.scope():
            ...     model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            >>> path = strategy.save_model(model, tempfile.mkdtemp() + "/m.keras")
            >>> path.endswith("m.keras")
            True
        """
        written = self.write_path(filepath)
        if written is None:
            return None
        os.makedirs(os.path.dirname(written) or ".", exist_ok=True)
        with self._writing():
            model.save(written, **kwargs)
        self._discard(written)
        return written if self.is_chief else None

    def save_checkpoint(
        self,
        checkpoint: tf.train.Checkpoint,
        directory: str | os.PathLike[str],
        max_to_keep: int = 3,
        checkpoint_number: int | None = None,
    ) -> str | None:
        """Saves ``checkpoint`` under ``directory`` once, keeping the last ``max_to_keep``.

        Call it on every process (see `save_model`). ``checkpoint_number`` names the file
        (``ckpt-<number>``, e.g. the epoch); by default the checkpoint's own save counter.

        Returns:
            The checkpoint's path prefix on the chief, None elsewhere.

        Example:
            >>> import tempfile, tfdist.strategies
            >>> strategy = tfdist.strategies.get_strategy("default")
            >>> ckpt = tf.train.Checkpoint(step=tf.Variable(3))
            >>> strategy.save_checkpoint(ckpt, tempfile.mkdtemp()).endswith("ckpt-1")
            True
        """
        written = self.write_path(directory)
        if written is None:
            return None
        with self._writing():
            manager = self._tfdist_managers.get(written)
            if manager is None:
                manager = tf.train.CheckpointManager(checkpoint, written, max_to_keep=max_to_keep)
                self._tfdist_managers[written] = manager
            prefix = manager.save(checkpoint_number=checkpoint_number)
        if not self.is_chief:
            self._discard(written)
            self._tfdist_managers.pop(written, None)
        return prefix if self.is_chief else None

    def restore_checkpoint(
        self, checkpoint: tf.train.Checkpoint, directory: str | os.PathLike[str]
    ) -> str | None:
        """Restores the chief's latest checkpoint in ``directory`` (every process reads it).

        Returns:
            The restored path prefix, or None if ``directory`` holds no checkpoint yet.

        Example:
            >>> import tempfile, tfdist.strategies
            >>> strategy = tfdist.strategies.get_strategy("default")
            >>> strategy.restore_checkpoint(tf.train.Checkpoint(), tempfile.mkdtemp()) is None
            True
        """
        latest = tf.train.latest_checkpoint(os.fspath(directory))
        if latest is not None:
            checkpoint.restore(latest)
        return latest

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

