"""What the strategies that split one model across processes share (``pipeline``, ``tensor``).

Every process of such a job runs the same script on the whole global batch (each step takes its
part), finds its place on the job's mesh from ``TF_CONFIG``, joins TensorFlow's collective runtime
within the start-up deadline, waits for the others at a normal exit (task 0 leads every
collective's resolution), and saves the whole model from the chief.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from tfdist.core.traits import TENSOR_SHARDS_ENV
from tfdist.errors import StrategyConfigError, format_error
from tfdist.mesh import ProcessGroup, task_rank
from tfdist.pipeline import transport
from tfdist.strategies.startup import startup_deadline

__all__ = ["ModelParallelMixin", "tensor_shards"]


def tensor_shards(shards: int | None, default: int,
                  environ: Mapping[str, str] | None = None) -> int:
    """T: ``shards`` if given, else ``$TFDIST_TENSOR_SHARDS``, else ``default``.

    Raises:
        StrategyConfigError: a value that is not a positive int.

    Example:
        >>> tensor_shards(None, 1, {}), tensor_shards(None, 1, {"TFDIST_TENSOR_SHARDS": "2"})
        (1, 2)
    """
    environ = os.environ if environ is None else environ
    value: Any = shards if shards is not None else environ.get(TENSOR_SHARDS_ENV, str(default))
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if isinstance(value, bool) or number < 1 or str(number) != str(value).strip():
        raise StrategyConfigError(format_error(
            "The tensor shard count must be a positive int.",
            received=f"shards={value!r}", expected="an int >= 1 that divides the processes",
            fix=f"pass shards=T (pipeline: tensor=T) or set {TENSOR_SHARDS_ENV}=T"))
    return number


_SAVE_KEY = "tfdist/save_model/{call}/{rank}"
_EXIT_KEY = "tfdist/exit/{rank}"
_PROBE_MS = 200


def _announce(key: str) -> None:
    """Sets ``key`` in the job's coordination service (a key-value store on task 0)."""
    from tensorflow.python.eager import context

    try:
        context.context().set_config_key_value(key, "1")
    except Exception:  # noqa: BLE001 - at exit, with the service gone: nothing to tell
        pass


def _announced(key: str, wait_ms: int) -> bool:
    """Whether ``key`` is set in the coordination service (waiting up to ``wait_ms`` ms)."""
    from tensorflow.python.eager import context

    try:
        context.context().get_config_key_value(key, max(1, wait_ms))
        return True
    except Exception:  # noqa: BLE001 - not set within the wait (DeadlineExceeded, NotFound)
        return False


@functools.cache  # once per process, like enable_collectives: one barrier, one instance key
def _wait_for_every_process_at_exit(world: ProcessGroup) -> None:
    """At exit, says so (a `save_model` waiting for this process stops waiting), then, at a
    normal exit, `transport.exit_barrier`; not after an uncaught exception (the launcher
    should hear of a failure at once, not after the barrier's timeout)."""
    failed = []
    previous_hook = sys.excepthook

    def record_failure(*exc_info: Any) -> None:
        failed.append(exc_info[0])
        previous_hook(*exc_info)

    def at_exit() -> None:
        _announce(_EXIT_KEY.format(rank=world.rank))
        if not failed:
            transport.exit_barrier(world)

    sys.excepthook = record_failure
    atexit.register(at_exit)


class ModelParallelMixin:
    """Mixed into a `TfdistStrategyMixin` + ``OneDeviceStrategy`` subclass that defines
    ``assemble(model)`` (the whole model on the chief, None elsewhere)."""

    def _job_place(self, tf_config: str | Mapping[str, Any] | None) -> tuple[Any, Any, int, int]:
        """``(cluster, task, processes, rank)`` of this process; one process of rank 0 when
        there is no ``TF_CONFIG``."""
        if tf_config is None and not os.environ.get("TF_CONFIG"):
            return None, None, 1, 0
        cluster, task = self._read_cluster(tf_config)  # type: ignore[attr-defined]
        processes = max(1, len(cluster.chief) + len(cluster.worker))
        return cluster, task, processes, task_rank(task.type, task.index,
                                                   chiefs=len(cluster.chief))

    def _join_collectives(self, deadline: float | None, cluster: Any, task: Any,
                          world: ProcessGroup) -> None:
        """Joins the job's collective runtime (at most ``deadline`` s) and, at exit, waits for
        every process of ``world``."""
        name = type(self).__name__
        with startup_deadline(deadline, cluster, task, f"{name} on {task}"):
            transport.enable_collectives(cluster, task)
        self._tfdist_world = world
        _wait_for_every_process_at_exit(world)

    @staticmethod
    def _device() -> str:
        return "/cpu:0" if not tf.config.list_physical_devices("GPU") else "/gpu:0"

    def input_context(self) -> tf.distribute.InputContext:
        """Every process reads the whole global batch (each step takes its replica's rows), so
        its one input pipeline batches by the global batch size."""
        return tf.distribute.InputContext(
            num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1)

    def _distribute_dataset_fn(self, dataset_fn: Any, options: Any) -> Any:
        return dataset_fn(self.input_context())

    def experimental_distribute_dataset(self, dataset: tf.data.Dataset,
                                        options: Any = None) -> tf.data.Dataset:
        """The dataset itself: one replica on this process's one device, which ``fit`` (both
        Kerases) iterates as it is. ``OneDeviceStrategy``'s distributed dataset would prefetch
        to that device through a ``MultiDeviceIterator`` built and torn down in every ``fit``
        call (tf-keras, 2 stages, 4 steps a call: 0.31 s a call against 0.15 s without)."""
        del options  # nothing to place: no device to fetch to but the one the data is on
        return dataset

    def save_model(self, model: Any, filepath: str | os.PathLike[str], **kwargs: Any) -> str | None:
        """Saves the whole model: every process calls it, the chief writes ``filepath``, a
        ``.keras`` file that ``keras.models.load_model`` opens in one process.

        Where ``filepath`` cannot be written the model is saved to a new temporary directory
        and the error names it (`SavingMixin.save_model`).

        Returns:
            ``filepath`` on the chief, None elsewhere.

        Raises:
            StrategyConfigError: A process of the job reached its end (or failed) without
                calling it: gathering the model needs every process. Or ``filepath`` cannot be
                written (the model is then saved elsewhere, named in the message).
        """
        self._every_process_saves()
        whole = self.assemble(model)  # type: ignore[attr-defined]
        if whole is None:
            return None
        path = os.fspath(filepath)
        self._save_or_rescue(whole, path, path, kwargs,  # type: ignore[attr-defined]
                             collective=False)
        return path

    def _every_process_saves(self) -> None:
        """Waits until every process of the job has called `save_model` (this is its Nth call);
        refuses at once when one of them reached its exit instead (`_announce_exit`)."""
        world: ProcessGroup | None = getattr(self, "_tfdist_world", None)
        if world is None or world.size < 2:
            return
        self._tfdist_saves = getattr(self, "_tfdist_saves", 0) + 1
        call = self._tfdist_saves
        _announce(_SAVE_KEY.format(call=call, rank=world.rank))
        limit = self.timeout or 300.0  # the pipeline's 0: transfers wait without a limit
        deadline = time.monotonic() + limit
        for peer in (r for r in range(world.size) if r != world.rank):
            while not _announced(_SAVE_KEY.format(call=call, rank=peer), _PROBE_MS):
                exited = _announced(_EXIT_KEY.format(rank=peer), 1)
                if exited or time.monotonic() > deadline:
                    raise StrategyConfigError(format_error(
                        f"save_model gathers the model from every process of the job, but "
                        f"the process of rank {peer} "
                        + ("reached the end of the script (or failed) without calling it"
                           if exited else f"did not call it within {limit:g} s") + ".",
                        received=f"save_model call {call} on rank {world.rank} only",
                        expected="every process calls save_model (the chief writes the file)",
                        fix="call strategy.save_model(model, path) on every process, not under "
                            "`if strategy.is_chief` (it returns None on the others)"))
