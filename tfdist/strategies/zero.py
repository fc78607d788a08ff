"""``multi_worker`` with ``zero=1|2|3``: ZeRO-sharded data parallelism (Keras 3).

Each of the D training processes keeps the optimizer slots of 1/D of the weights (stage 1), and
receives only that part's summed gradients (stage 2), and holds only that part of the weights
(stage 3); the parts are balanced by bytes, a large weight split by rows across owners
(`tfdist.zero.partition`). A step is exact: the same update one process makes on the global
batch, with the model's own optimizer (Adam, weight decay, ``clipnorm`` and ``global_clipnorm``
over the whole model, embeddings' sparse gradients, sample weights). See `tfdist.zero.engine`.

Every process runs the same script and is given the same global batches (each step takes its
rows), as under the ``tensor`` strategy; the model comes from ``strategy.build_model``.

Example:
    Under ``tfdist-launch --workers 2 --zero 2 train.py`` (``TFDIST_ZERO=2``)::

        strategy = tfdist.get_strategy("auto")         # multi_worker, ZeRO stage 2
        model = strategy.build_model(build_model_fn)   # whole weights, 1/D of the slots
        model.compile(optimizer=keras.optimizers.Adam(global_clipnorm=1.0), loss="mse")
        model.fit(dataset, epochs=2)                   # the same global batches everywhere
        strategy.save_model(model, "model.keras")      # every process; the chief writes it
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from tfdist.compat import models as keras_compat
from tfdist.core import traits as builtin
from tfdist.core.flavour import keras_flavour
from tfdist.errors import KerasCompatibilityError, StrategyConfigError, format_error
from tfdist.options import check_positive_number
from tfdist.parallel.keys import next_key
from tfdist.parallel.mesh import DATA
from tfdist.parallel.ops import DEFAULT_TIMEOUT, broadcast_variable
from tfdist.strategies.base import TfdistStrategyMixin
from tfdist.strategies.model_parallel import ModelParallelMixin
from tfdist.strategies.startup import resolve_startup_timeout
from tfdist.watchdog import StepWatchdog
from tfdist.zero.engine import ZeroEngine
from tfdist.zero.model import attach, original_class
from tfdist.zero.partition import check_stage

__all__ = ["ZeroStrategy", "ZERO_ENV", "zero_stage", "data_axis_stage", "attach_data_axis"]

ZERO_ENV = builtin.ZERO_ENV
_log = logging.getLogger("tfdist")
_JOINED: list[bool] = []  # TensorFlow's collective runtime starts once per process


def zero_stage(zero: object = None, environ: Mapping[str, str] | None = None) -> int:
    """The ZeRO stage asked for: ``zero`` if given, else ``$TFDIST_ZERO`` (which
    ``tfdist-launch --zero`` writes), else 0 (none).

    Example:
        >>> zero_stage(None, {"TFDIST_ZERO": "3"}), zero_stage(1, {}), zero_stage(None, {})
        (3, 1, 0)
    """
    environ = os.environ if environ is None else environ
    if zero is None:
        return check_stage(environ.get(ZERO_ENV) or None, field=ZERO_ENV)
    return check_stage(zero)


def data_axis_stage(zero: object, replicas: int, tensor: int, flavour: str,
                    strategy: str) -> int:
    """`zero_stage` for the data axis of ``strategy`` (``pipeline`` or ``tensor``, with
    ``replicas`` data replicas and T = ``tensor``), refused before any process waits for
    another where that strategy cannot run it (`tfdist.zero.data_axis.check_zero`)."""
    stage = zero_stage(zero)
    if stage:
        from tfdist.zero.data_axis import check_zero

        check_zero(stage, replicas, tensor, flavour, strategy)
    return stage


def attach_data_axis(model: Any, stage: int, data: Any, timeout: float, pipe: Any = None,
                     tensor: Any = None, split: frozenset[int] = frozenset()) -> Any:
    """The ZeRO step of a pipeline stage's or tensor shard's ``model`` on its ``data`` group
    (call it in the strategy's scope): `tfdist.zero.data_axis.DataAxisZero` at stages 1-2,
    `tfdist.zero.data_axis_layers.DataAxisLayers` at stage 3 (which drops the model's whole
    weights). ``pipe``: the replica's stages (the global norm); ``tensor``, ``split``: the
    tensor group and the indexes of the weights split over it."""
    from tfdist.zero.data_axis import SKIP_GATHER_ENV, DataAxisZero

    sabotage = os.environ.get(SKIP_GATHER_ENV) or None
    if stage == 3:
        from tfdist.zero.data_axis_layers import DataAxisLayers

        return DataAxisLayers(model, data, pipe=pipe, tensor=tensor, split=split,
                              timeout=timeout, sabotage=sabotage)
    return DataAxisZero(model.trainable_weights, stage, data, pipe=pipe, tensor=tensor,
                        split=split, timeout=timeout, sabotage=sabotage)


class ZeroStrategy(ModelParallelMixin, TfdistStrategyMixin, tf.distribute.OneDeviceStrategy):
    """ZeRO stage 1, 2 or 3 over the chief and workers of TF_CONFIG (made by
    ``get_strategy("multi_worker", zero=stage)``).

    Args:
        zero: The stage: 1, 2 or 3.
        timeout_seconds: Deadline of each step's collectives (default 300 s).
        startup_timeout_seconds: Deadline for every process to join.
        tf_config: The TF_CONFIG to use instead of the environment's.
        sabotage: For tfdist's own tests: ``"skip_gather"`` leaves the updated parts
            ungathered (parity must then fail).

    Raises:
        StrategyConfigError: an unknown stage, or a job of one process (D=1: nothing to shard).
        KerasCompatibilityError: tf-keras (ZeRO is Keras 3 only).

    Example:
        >>> import tfdist
        >>> strategy = tfdist.get_strategy("multi_worker", zero=2)  # doctest: +SKIP
        >>> type(strategy).__name__, strategy.stage, strategy.num_replicas  # doctest: +SKIP
        ('ZeroStrategy', 2, 2)
    """

    name = "multi_worker"
    traits = builtin.MULTI_WORKER
    per_rank_backups = True  # each process holds different optimizer slots

    def __init__(self, zero: int, timeout_seconds: float | None = None,
                 startup_timeout_seconds: float | None = None,
                 tf_config: str | Mapping[str, Any] | None = None,
                 sabotage: str | None = None) -> None:
        self.stage = check_stage(zero)
        _refuse_tf_keras(self.stage)
        deadline = check_positive_number(
            "startup_timeout_seconds", resolve_startup_timeout(startup_timeout_seconds))
        self.timeout = float(check_positive_number(
            "timeout_seconds", DEFAULT_TIMEOUT if timeout_seconds is None else timeout_seconds))
        self.first_step_timeout = max(self.timeout, float(deadline or 0.0))
        self.sabotage = sabotage
        cluster, task, self.place = self._job_place(tf_config, 1, 1)
        _refuse_one_process(self.stage, self.place.size_of(DATA))
        self.collective_calls = ("evaluate", "predict") if self.stage == 3 else ()
        if _JOINED:  # a second ZeroStrategy in this process: the runtime is up already
            self._tfdist_world = self.place.world()
        else:
            self._join_collectives(deadline, cluster, task, self.place.world())
            _JOINED.append(True)
        super().__init__(self._device())
        self._init_tfdist(cluster, task)

    def describe(self) -> str:
        chief = ", chief" if self.is_chief else ""
        return (f"multi_worker, ZeRO stage {self.stage}: process {self.place.rank_on(DATA)} "
                f"of {self.num_replicas}{chief}")

    def runs_locally(self, method: str, x: Any = None) -> bool:
        """Stages 1 and 2: every process holds the whole weights, so ``evaluate`` and
        ``predict`` run on each alone; stage 3 gathers the weights: every process calls them."""
        return self.stage < 3 and method in ("evaluate", "predict")

    def build_model(self, model_or_fn: Any) -> Any:
        """The model this process trains: built whole (``model_or_fn()`` in this strategy's
        scope, or the model given), data rank 0's weights on every process, partitioned.

        Raises:
            StrategyConfigError: a model ZeRO cannot partition (named, with why), or one whose
                class overrides a step (ZeRO runs its own).
        """
        with self.scope():
            model = model_or_fn if hasattr(model_or_fn, "layers") else model_or_fn()
            keras_compat.refuse_step_overrides(model, f"ZeRO stage {self.stage}")
            group = self.data_group
            for variable in model.weights:
                broadcast_variable(variable, group=group, instance=next_key(group.key),
                                   timeout=self.timeout)
            engine = ZeroEngine(model, self.stage, group, self.timeout, self.sabotage)
        watchdog = StepWatchdog(self.timeout, f"ZeRO data group of {group.size}",
                                first_seconds=self.first_step_timeout)
        attach(model, engine, watchdog)
        if self.is_chief:
            held = engine.plan.owned_bytes()
            _log.info("%s: %d trainable weights, %d bytes, parts of %s bytes", self.describe(),
                      len(engine.variables), engine.plan.total_bytes, held)
        return self._mark_split(model)

    def assemble(self, model: Any) -> Any | None:
        """The whole model on the chief, None elsewhere (stage 3 gathers it: every process
        calls `save_model`)."""
        return model if self.is_chief else None

    def save_model(self, model: Any, filepath: str | os.PathLike[str],
                   **kwargs: Any) -> str | None:
        """Saves the whole model as one process's ``.keras`` file (every process calls it; the
        chief writes ``filepath``): whole weights, and the optimizer whole, its slots gathered
        from their owners (``keras.models.load_model`` resumes it in one process).

        Returns:
            ``filepath`` on the chief, None elsewhere.
        """
        engine: ZeroEngine = model.zero_engine
        optimizer = getattr(model, "optimizer", None)
        if engine.stage == 3:
            engine.materialize()
        whole = engine.whole_optimizer(optimizer) if getattr(optimizer, "built", False) \
            else None
        swapped, model.__class__ = model.__class__, original_class(model)
        if whole is not None:
            model.optimizer = whole
        try:
            return super().save_model(model, filepath, **kwargs)
        finally:
            model.__class__ = swapped
            if whole is not None:
                model.optimizer = optimizer
            if engine.stage == 3:
                engine.drop_whole()

    def backup_layout(self) -> dict[str, Any]:
        """What this process's backup depends on (its part of the optimizer state): a resume
        with another D or stage is refused (`tfdist.resilience.claim`), not re-sharded.

        Example:
            >>> ZeroStrategy.backup_layout.__doc__ is not None
            True
        """
        return {"strategy": self.name, "zero": self.stage, "data": self.num_replicas}


def _refuse_tf_keras(stage: int) -> None:
    if keras_flavour() == "tf_keras":
        raise KerasCompatibilityError(format_error(
            "ZeRO runs the model on gathered weights and builds the optimizer on its parts "
            "with Keras 3's API (StatelessScope, optimizer.build); tf-keras has neither.",
            received=f"zero={stage} with tf-keras (TF_USE_LEGACY_KERAS=1)",
            expected="Keras 3 (TF_USE_LEGACY_KERAS unset)",
            fix="unset TF_USE_LEGACY_KERAS and build the model with `import keras`, or drop "
                "--zero to train replicated with tf-keras"))


def _refuse_one_process(stage: int, processes: int) -> None:
    if processes < 2:
        raise StrategyConfigError(format_error(
            "ZeRO shards over the data-parallel processes, and this job has one (D=1): there "
            "is nothing to shard.",
            received=f"zero={stage} with D={processes} (one training process)",
            expected="D >= 2 training processes (chief and workers)",
            fix="launch with --workers 2 or more (tfdist-launch --workers 2 --zero "
                f"{stage}), or drop zero"))
