"""``"multi_worker"``: synchronous training across processes (Keras 3 or tf-keras).

A tfdist `tf.distribute.MultiWorkerMirroredStrategy`. Every worker (chief included) runs the same
script; gradients are all-reduced with collective ops each step. Saving is a collective: every
worker calls `save_model`/`save_checkpoint`; the chief writes the real path and the others a
temporary directory that is deleted right after.

Waiting for peers: creating the strategy blocks until every worker has started, and TensorFlow
has no deadline for this. tfdist sets one, ``startup_timeout_seconds`` (default 600 s or
``$TFDIST_STARTUP_TIMEOUT``; see `tfdist.strategies.startup`): the process names the peers that
do not answer and is killed. Once training runs,
``timeout_seconds`` bounds each collective (``CommunicationOptions``): a peer that stops mid-step
makes the others fail with ``DeadlineExceededError`` instead of hanging.

Keras 3: its ``model.fit`` cannot run under this strategy as released (keras#20585,
tensorflow#72388); creating the strategy installs tfdist's version-guarded shims
(`tfdist.compat.install_keras3_shims`), after which it trains as tf-keras does: identical
weights on every worker, equal to one process on the global batches.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from tfdist import compat
from tfdist.coordinator_fit import require_steps
from tfdist.core import traits as builtin
from tfdist.errors import StrategyConfigError, format_error
from tfdist.options import check_choice, check_positive_int, check_positive_number
from tfdist.strategies import rendezvous
from tfdist.strategies.base import TfdistStrategyMixin, cluster_resolver
from tfdist.strategies.startup import resolve_startup_timeout, startup_deadline

__all__ = ["MultiWorkerMirroredStrategy", "IMPLEMENTATIONS"]

_Impl = tf.distribute.experimental.CommunicationImplementation
IMPLEMENTATIONS = {"auto": _Impl.AUTO, "ring": _Impl.RING, "nccl": _Impl.NCCL}
"""Names accepted for ``implementation`` -> TF's ``CommunicationImplementation``."""


def communication_options(
    implementation: str = "auto", bytes_per_pack: int = 0, timeout_seconds: float | None = None
) -> tf.distribute.experimental.CommunicationOptions:
    """Checks the collective options and builds TF's ``CommunicationOptions``.

    Example:
        >>> communication_options("ring", timeout_seconds=60).timeout_seconds
        60.0
    """
    check_choice("implementation", implementation, tuple(IMPLEMENTATIONS),
                 fix="use 'ring' (gRPC, any device), 'nccl' (GPUs) or 'auto'")
    if bytes_per_pack != 0:
        check_positive_int("bytes_per_pack", bytes_per_pack, allow_none=False)
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=bytes_per_pack,
        timeout_seconds=check_positive_number("timeout_seconds", timeout_seconds),
        implementation=IMPLEMENTATIONS[implementation],
    )


class MultiWorkerMirroredStrategy(TfdistStrategyMixin, tf.distribute.MultiWorkerMirroredStrategy):
    """Synchronous data parallelism over the chief and workers of TF_CONFIG.

    Args:
        implementation: Collective implementation: ``"ring"``, ``"nccl"`` or ``"auto"``.
        bytes_per_pack: Gradients are packed into chunks of about this many bytes before being
            all-reduced (0: TF's default, one pack).
        timeout_seconds: Deadline of each collective op (None: none).
        startup_timeout_seconds: Deadline for all workers to join (None: $TFDIST_STARTUP_TIMEOUT,
            else 600 s; see `resolve_startup_timeout`). Past it the process prints the peers that
            do not answer and is killed (SIGKILL), instead of waiting forever as TF would.
        tf_config: The TF_CONFIG to use instead of the environment's (JSON text or a mapping).
        zero: ZeRO stage 1, 2 or 3 (None: ``$TFDIST_ZERO``, which ``tfdist-launch --zero``
            writes; 0 or unset: replicated). With a stage, the strategy made is a
            `tfdist.strategies.zero.ZeroStrategy` (optimizer state, gradients, weights sharded
            over the workers; Keras 3; the model from ``strategy.build_model``).

    Raises:
        ClusterConfigError: TF_CONFIG is missing or invalid (raised before any waiting).

    Example:
        >>> import json
        >>> config = {"cluster": {"worker": ["localhost:12345"]},
        ...           "task": {"type": "worker", "index": 0}}
        >>> strategy = MultiWorkerMirroredStrategy(tf_config=config)  # doctest: +SKIP
        >>> strategy.num_workers, strategy.is_chief  # doctest: +SKIP
        (1, True)
    """

    name = "multi_worker"
    traits = builtin.MULTI_WORKER
    every_worker_saves = True
    preemption_saves = True
    collective_calls = ("evaluate",)  # predict runs on each worker alone (runs_locally)

    def __new__(cls, *args: Any, zero: int | None = None, **kwargs: Any) -> Any:
        """A `ZeroStrategy` when a ZeRO stage is asked for (``zero`` or ``$TFDIST_ZERO``)."""
        from tfdist.strategies.zero import ZeroStrategy, zero_stage

        stage = zero_stage(zero)
        if not stage:
            return super().__new__(cls)
        if args or set(kwargs) - _ZERO_OPTIONS:
            given = sorted(set(kwargs) - _ZERO_OPTIONS) or ["positional arguments"]
            raise StrategyConfigError(format_error(
                "These options of the replicated all-reduce do not apply under ZeRO, whose "
                "collectives are tfdist's own.",
                received=f"zero={stage} with {', '.join(given)}",
                expected=f"only {', '.join(sorted(_ZERO_OPTIONS))} beside zero",
                fix="drop them, or drop zero"))
        return ZeroStrategy(stage, **kwargs)

    def __init__(
        self,
        implementation: str = "auto",
        bytes_per_pack: int = 0,
        timeout_seconds: float | None = None,
        startup_timeout_seconds: float | None = None,
        tf_config: str | Mapping[str, Any] | None = None,
        zero: int | None = None,
    ) -> None:
        del zero  # 0: replicated (a stage made a ZeroStrategy in __new__)
        options = communication_options(implementation, bytes_per_pack, timeout_seconds)
        deadline = check_positive_number(
            "startup_timeout_seconds", resolve_startup_timeout(startup_timeout_seconds)
        )
        self._check_keras()
        compat.install_keras3_shims()
        cluster, task = self._read_cluster(tf_config)
        with startup_deadline(deadline, cluster, task, f"MultiWorkerMirroredStrategy on {task}"):
            super().__init__(
                cluster_resolver=cluster_resolver(cluster, task), communication_options=options
            )
        self._init_tfdist(cluster, task)
        self._tfdist_call_limit = float(options.timeout_seconds or _CALL_LIMIT_S)
        if self.num_workers > 1:
            rendezvous.announce_exit_at_exit(self.worker_index)
        _warn_if_created_before(task)

    def runs_locally(self, method: str, x: Any = None) -> bool:
        """``predict`` runs on each worker alone, whole (Keras would split its batches and
        gather the rows: a collective, which on the chief alone failed with "task:1 crashed").
        ``evaluate`` stays a collective: every worker calls it (its metrics are summed across
        workers when read)."""
        return method == "predict"

    def check_model_call(self, model: Any, method: str, call: Mapping[str, Any]) -> None:
        """Refuses ``fit(validation_data=...)`` without ``validation_steps``: each worker
        evaluates its shard of the data, and shards of unequal length make the workers run
        different collectives at the end of the first epoch ("Collective instance ...
        expected type ..."). Before ``evaluate`` (a collective), waits for every worker to make
        the same call and refuses at once when one has ended instead (called on the chief
        alone: TensorFlow said so only once the peer's heartbeats had stopped)."""
        if method == "evaluate":
            rendezvous.every_process_calls(
                self.__dict__.setdefault("_tfdist_calls", {}), self.worker_index,
                self.num_workers, "model.evaluate",
                why=f"model.evaluate under {self.name} is a collective of all "
                    f"{self.num_workers} workers (their metrics are summed)",
                expected="model.evaluate called on every worker (each returns the metrics of "
                         "the whole input)",
                fix="call model.evaluate on every worker, not under `if strategy.is_chief`; "
                    "print or save its result on the chief alone",
                limit=self._tfdist_call_limit)
        if method == "fit" and call.get("validation_data") is not None:
            require_steps(call.get("validation_steps"), "validation_steps", "fit",
                          "MultiWorkerMirroredStrategy",
                          fix="pass validation_steps=N (N batches every worker has, e.g. "
                          "len(x_val) // global_batch), or validate after fit with "
                          "model.evaluate on every worker")


_created = 0
_CALL_LIMIT_S = 300.0
"""How long ``model.evaluate`` waits for every worker to call it, without ``timeout_seconds``."""
_ZERO_OPTIONS = frozenset({"timeout_seconds", "startup_timeout_seconds", "tf_config"})


def _warn_if_created_before(task: object) -> None:
    """Warns on a second strategy in one process: TF sets up collectives once per process."""
    global _created
    _created += 1
    if _created > 1:
        logging.getLogger("tfdist").warning(
            "MultiWorkerMirroredStrategy created %d times in this process (task %s). TensorFlow "
            "configures collective ops once per process; a second strategy in a job with several "
            "workers can hang (seen in tfdist-bench). Create the strategy once and reuse it.",
            _created, task,
        )
