"""``"pipeline"``: a model split into K stages on K processes, micro-batches pipelined (GPipe),
and D data-parallel replicas of that pipeline on D x K processes.

Every process of the job runs the same script. `PipelineStrategy.build_model` turns the whole
model (a build function, or a built Sequential/chain model) into this process's stage: a Keras
model that holds only the stage's layers and variables, and whose ``fit``/``evaluate``/
``predict`` run the pipeline schedule (`tfdist.pipeline`). Rank ``r`` (its worker index) holds
stage ``r % K`` of replica ``r // K``; worker 0 (the chief) holds stage 0 of replica 0.

Activations go forward and gradients back between neighbouring stages with TensorFlow's
collective ops (a broadcast in a group of two acts as send/recv), over the same gRPC runtime as
MultiWorkerMirrored; each stage's gradients are averaged over its D replicas with an all-reduce.
A step is the same as one step of the whole model on the whole global batch.

With ``tensor=T`` (``--stages K --tensor T``, Keras 3) each stage is split over T processes by
tensor parallelism (`tfdist.tensor.stages`): rank ``r`` holds shard ``r % T`` of stage
``(r // T) % K`` of replica ``r // (K T)``; each process allocates only its shard, the cuts carry
whole activations between equal shards of neighbouring stages, and a stage's split layers
all-reduce over its tensor group.

Example:
    Under ``tfdist-launch --strategy pipeline --workers 2 --stages 2 train.py``::

        strategy = tfdist.get_strategy("auto")           # pipeline, K=2, from the launcher
        model = strategy.build_model(build_model_fn)     # this process's stage
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
        model.fit(dataset, epochs=2)                     # the same global batches everywhere
        model.save("model.keras")                        # every process; the chief writes it
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from tfdist.core import flavour
from tfdist.core import traits as builtin
from tfdist.options import check_positive_number
from tfdist.parallel.mesh import DATA, PIPE, TENSOR
from tfdist.pipeline import batch_norm, stage, transport
from tfdist.pipeline.config import (
    LAYER_COSTS_ENV,
    MICRO_BATCHES_ENV,
    SCHEDULE_ENV,
    STAGES_ENV,
    PipelineConfig,
)
from tfdist.pipeline.consistency import gated, step_checks
from tfdist.pipeline.keras_model import apply_step, build_stage_optimizer
from tfdist.pipeline.layout import PipelineLayout
from tfdist.pipeline.loss_and_metrics import mean_loss
from tfdist.pipeline.modes import PipelineMode, choose_mode
from tfdist.pipeline.zero_calls import checked_variables
from tfdist.resilience.pipeline_backup import PipelineBackupMixin
from tfdist.strategies.base import TfdistStrategyMixin
from tfdist.strategies.initial_weights import stages_drawn_when_made, stages_initial_weights
from tfdist.strategies.model_parallel import ModelParallelMixin
from tfdist.strategies.pipeline_checks import PipelineChecksMixin
from tfdist.strategies.pipeline_weights import StageWeightsMixin
from tfdist.strategies.pipeline_weights import stage_model as _stage_model
from tfdist.strategies.startup import resolve_startup_timeout
from tfdist.strategies.zero import attach_data_axis, data_axis_stage

__all__ = ["PipelineStrategy", "STAGES_ENV", "MICRO_BATCHES_ENV", "SCHEDULE_ENV",
           "LAYER_COSTS_ENV"]


_log = logging.getLogger("tfdist")


def _keep_micro_batch_gradients_apart() -> None:
    """Turns Grappler's arithmetic optimizer off in this stage process.

    With it on, the last stage kept every micro-batch's weight gradients until the end of the
    step, whatever the order the schedule imposes (measured, 57 MB MLP, K=2, Adam: the last
    stage's peak grew by 351 MB at M=8 against 148 MB with it off and 141 MB at M=1); with it
    off a stage's peak is its weights, gradients and slots plus the activations in flight, as
    the schedule promises. ``PipelineStrategy(arithmetic_optimization=True)`` keeps it on.
    """
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    _log.info("tfdist pipeline: Grappler's arithmetic optimization is off in this stage "
              "process (it kept every micro-batch's gradients alive; see docs/strategies/"
              "pipeline.md, Memory)")


def _warn_if_one_inter_op_thread() -> None:
    """With one inter-op thread a stage's transfers wait behind its compute: no overlap."""
    if tf.config.threading.get_inter_op_parallelism_threads() == 1:
        _log.warning(
            "tfdist pipeline: inter_op_parallelism_threads is 1, so this stage's sends and "
            "receives wait behind its compute and the stages run one after the other "
            "(measured: 1.95x the GPipe bound at M=8, 1.2x with 2 threads). Fix: set it to 2 "
            "or more (tf.config.threading.set_inter_op_parallelism_threads(2)).")


class PipelineStrategy(PipelineBackupMixin, StageWeightsMixin, PipelineChecksMixin,
                       ModelParallelMixin, TfdistStrategyMixin, tf.distribute.OneDeviceStrategy):
    """Pipeline (and data x pipeline) parallelism over the workers of TF_CONFIG.

    Args:
        stages: K, the number of stages (None: ``$TFDIST_PIPELINE_STAGES``, else 1).
        micro_batches: M, micro-batches per replica batch (None: ``$TFDIST_PIPELINE_MICRO_BATCHES``,
            else 1). The global batch must be a multiple of D x M.
        schedule: A name of `tfdist.pipeline.schedule.SCHEDULES` (None:
            ``$TFDIST_PIPELINE_SCHEDULE``, else ``"gpipe"``); all give the same result.
            ``"gpipe"``: all forwards, then all backwards; ``"1f1b"``: one forward, one
            backward (a stage keeps at most K - stage micro-batches' activations);
            ``"interleaved"`` (Megatron-LM's): each process holds ``chunks`` pieces of the
            model (process k: pieces k, k + K, ...), the bubble shrinks to (K-1)/(v M) for v
            times as many transfers, M a multiple of K; ``"zb-h1"`` (zero bubble): 1F1B with
            each backward split, the weight gradients computed in the bubble.
        chunks: v, model chunks per process with ``schedule="interleaved"`` (None:
            ``$TFDIST_PIPELINE_CHUNKS``, else 1).
        split_points: The first layer of each stage but the first (layer names); None balances
            the stages by ``layer_costs``, else by parameter count.
        layer_costs: Measured seconds per layer (a list, or a JSON file such as
            ``tfdist-advise --json``'s; None: ``$TFDIST_PIPELINE_LAYER_COSTS``, else none).
        timeout_seconds: Deadline of each transfer between stages and of each batch of
            ``fit``, ``evaluate`` and ``predict`` (None: no transfer deadline, and a batch
            deadline of `tfdist.pipeline.keras_model.STEP_TIMEOUT`, 600 s; a function's first
            batch gets the start-up deadline if longer).
        startup_timeout_seconds: Deadline for all processes to join (see `MultiWorkerMirrored`).
        tf_config: The TF_CONFIG to use instead of the environment's.
        devices: One local device per stage, to hold all K stages in this one process
            (``["/gpu:0", "/gpu:1"]``). None: in a single process with K > 1, the first K GPUs,
            else the first K logical CPUs; in a multi-process job, one stage per process.
        batch_norm: ``"refuse"`` (default: a BatchNormalization anywhere in the model, nested
            ones included, is refused when M > 1) or ``"per_micro_batch"`` (GPipe's
            per-micro-batch statistics, an explicit opt-in).
        arithmetic_optimization: Keep Grappler's arithmetic optimizer on in a stage process
            (default False: with it on, the last stage kept every micro-batch's gradients
            until the end of the step; see ``_keep_micro_batch_gradients_apart``).
        recompute: Keep only each micro-batch's stage input until its backward, which runs
            the stage's forward again (activation recomputation: less memory, one more forward).
        tensor: T, the processes each stage is split over (None: the job's ``TFDIST_MESH``;
            without it ``$TFDIST_TENSOR_SHARDS``; else 1; Keras 3). D = processes / (K x T).
        rules: ``{layer-name regex: kind}`` overriding the automatic tensor splits
            (`tfdist.tensor.rules`; with T > 1 only).
        weight_gradients: ``"sum"`` (None: ``$TFDIST_PIPELINE_WEIGHT_GRADIENTS``, else this
            default: each micro-batch's weight gradients summed through the step) or
            ``"whole_batch"`` (once per step over the replica batch, for one more forward of
            the stage: a stage then holds no gradient sums, the memory a stage trained with
            SGD saves most; T = 1, no layer with a random seed; `tfdist.pipeline.batch_weights`).
        zero: ZeRO stage 1 or 2 on the data axis (None: ``$TFDIST_ZERO``, which
            ``tfdist-launch --zero`` writes; else none): each stage's D replicas keep the
            optimizer slots of 1/D of the stage's weights, update that part and all-gather it
            (stage 2 also reduce-scatters the gradients; `tfdist.zero.data_axis`). Keras 3,
            D >= 2, T = 1; stage 3 is refused.

    Attributes:
        config: The settings above, validated (`tfdist.pipeline.config.PipelineConfig`).
        mode: Where this process's stages live, chosen once here
            (`tfdist.pipeline.modes`): one stage per process, or all K on local devices.

    Raises:
        StrategyConfigError: bad stages/micro-batches/schedule/devices, or a process count that
            is not a multiple of K (raised before any waiting).

    Example:
        >>> strategy = PipelineStrategy()   # one process: one stage, a plain model
        >>> strategy.stages, strategy.micro_batches, strategy.num_replicas
        (1, 1, 1)
    """

    name = "pipeline"
    traits = builtin.PIPELINE
    per_rank_backups = True
    preemption_saves = True

    def __init__(
        self,
        stages: int | None = None,
        micro_batches: int | None = None,
        schedule: str | None = None,
        chunks: int | None = None,
        split_points: Sequence[str] | None = None,
        layer_costs: Sequence[float] | str | os.PathLike[str] | None = None,
        timeout_seconds: float | None = None,
        startup_timeout_seconds: float | None = None,
        tf_config: str | Mapping[str, Any] | None = None,
        devices: Sequence[str] | None = None,
        batch_norm: str | None = None,
        arithmetic_optimization: bool = False,
        recompute: bool = False,
        tensor: int | None = None,
        rules: Mapping[str, str] | None = None,
        weight_gradients: str | None = None,
        zero: int | None = None,
    ) -> None:
        self.config = PipelineConfig.from_env(
            stages=stages, micro_batches=micro_batches, schedule=schedule, chunks=chunks,
            split_points=split_points, layer_costs=layer_costs, timeout=timeout_seconds,
            devices=devices, batch_norm=batch_norm,
            arithmetic_optimization=arithmetic_optimization, recompute=recompute,
            weight_gradients=weight_gradients)
        deadline = check_positive_number(
            "startup_timeout_seconds", resolve_startup_timeout(startup_timeout_seconds))
        self.startup_timeout = float(deadline or 0.0)
        self._check_keras()
        cluster, task, place = self._job_place(tf_config, tensor, self.traits.tensor_default)
        if rules:
            from tfdist.tensor.rules import check_rules

            rules = check_rules(rules)
        self.rules = dict(rules or {})
        self.mode: PipelineMode = choose_mode(self.config, place.mesh.size, place.rank,
                                              place.size_of(TENSOR))
        self.zero = data_axis_stage(zero, self.layout.replicas, place.size_of(TENSOR),
                                    flavour.keras_flavour(), "pipeline")
        if self.zero == 3:
            self._check_zero3()
        if place.mesh.size > 1:
            _warn_if_one_inter_op_thread()
            if self.config.stages > 1 and not self.config.arithmetic_optimization:
                _keep_micro_batch_gradients_apart()
            self._join_collectives(deadline, cluster, task, self.layout.world())
        super().__init__(self._device())
        self._init_tfdist(cluster, task)
        self.spec: stage.ModelSpec | None = None
        self.bounds: tuple[int, ...] | None = None
        self.split: Any = None  # a `tfdist.tensor.stages.StageSplit` when T > 1

    # ----------------------------------------------------------------- surface
    @property
    def stages(self) -> int:
        """K, the model's stages (all of them, whichever mode holds them)."""
        return self.config.stages

    @property
    def micro_batches(self) -> int:
        """M, micro-batches per replica batch."""
        return self.config.micro_batches

    @property
    def shards(self) -> int:
        """T, the tensor-parallel shards of each stage (1: none)."""
        return self.layout.tensor

    @property
    def plan(self) -> Any:
        """The whole model's tensor plan (`tfdist.tensor.plan.TensorPlan`) when T > 1, after
        `build_model`; else None."""
        return None if self.split is None else self.split.plan

    @property
    def schedule(self) -> str:
        return self.config.schedule

    @property
    def timeout(self) -> float:
        """Seconds each transfer between stages may wait (0: no limit)."""
        return self.config.timeout or 0.0

    @property
    def layout(self) -> PipelineLayout:
        """This process's place: its replica and the stages it holds (``layout.held``)."""
        return self.mode.layout

    @property
    def devices(self) -> tuple[str, ...]:
        """Stage ``k``'s local device when this process holds every stage, else ``()``."""
        return self.mode.devices

    @property
    def num_replicas(self) -> int:
        """D: the pipeline replicas whose gradients make one global step."""
        return self.layout.replicas

    @property
    def num_workers(self) -> int:
        """All processes of the job (D x K x T)."""
        return self.layout.processes

    @property
    def worker_index(self) -> int:
        return self.layout.rank

    def describe(self) -> str:
        """One line: where this process's stages are (its mode), micro-batches, schedule.

        Example:
            >>> PipelineStrategy().describe()
            'pipeline: stage 0 of 1, replica 0 of 1, 1 micro-batch(es), gpipe, chief'
        """
        chief = ", chief" if self.is_chief else ""
        shard = (f", shard {self.layout.coordinates.tensor} of {self.shards}"
                 if self.shards > 1 else "")
        chunks = f" x {self.config.chunks} chunks" if self.config.chunks > 1 else ""
        return (f"pipeline: {self.mode.where()}{shard}, {self.micro_batches} micro-batch(es), "
                f"{self.schedule}{chunks}{chief}")

    # ----------------------------------------------------------------- the model
    def plan_stages(self, model_or_fn: Any) -> tuple[stage.ModelSpec, tuple[int, ...]]:
        """Describes the whole model (no weights for a build function) and splits it.

        Raises:
            StrategyConfigError: too many stages, bad split points, a layer used across stages
                (skip connections), or a layer the pipeline cannot train exactly.
        """
        if self.config.chunks > 1:
            model_or_fn = stage.describe_model(model_or_fn)  # once: its seeds are the model's
            self.config.schedule_class.check(self.stages, self.micro_batches,
                                             self.config.chunks, len(model_or_fn.nodes))
        return stage.split_model(model_or_fn, self.config.pieces, self.micro_batches,
                                 self.config.split_points, self.config.layer_costs,
                                 self.config.batch_norm)

    def build_model(self, model_or_fn: Any) -> Any:
        """This process's stage of the model, ready to ``compile`` and ``fit``.

        Args:
            model_or_fn: A function that builds the whole Keras model (Sequential, or a
                functional chain of layers); called without allocating weights, so each process
                holds only its stage. Or a built model: each stage copies its layers' weights
                from it (the whole model then exists once per process).

        Returns:
            A Keras model of this stage's layers whose steps run the pipeline.
        """
        spec, bounds = self.plan_stages(model_or_fn)
        self.spec, self.bounds = spec, bounds
        self._check_whole_batch(spec)
        if self.shards > 1:
            from tfdist.tensor.stages import stage_split

            self.split = stage_split(spec, bounds, self.rules, self.layout.group(TENSOR),
                                     self.timeout or None)
            if self.is_chief:
                _log.info("%s\n%s", self.describe(), self.split.plan.table())
        built = hasattr(model_or_fn, "layers")
        with contextlib.nullcontext() if built else stages_drawn_when_made(self, spec):
            model = self.mode.build(spec, bounds, self,
                                    None if self.split is None else self.split.layer_maker)
        batch_norm.check_stage(model, self.micro_batches, self.config.batch_norm,
                               self.layout.group(PIPE), self.timeout)
        held = self.mode.pieces
        if built:
            set_weights = stage.set_layer_weights if self.split is None else \
                self.split.set_weights
            for i, k in enumerate(held):
                set_weights(_stage_model(model, i), spec, stage.stage_layers(spec, bounds, k),
                            stage.stage_weights(model_or_fn, spec, bounds, k))
        else:
            stages_initial_weights(self, model, spec, bounds)
            self.mode.sync_tied(model)
            if self.split is not None:  # replicated weights from shard 0
                self.split.share_replicated(model, stage.stage_layers(spec, bounds, held[0]),
                                            spec)
            if self.layout.replicas > 1:
                self._broadcast_from_first_replica(model)
        if self.split is not None:  # blocks split inside: sharded now their weights agree
            for i, k in enumerate(held):
                self.split.shard_blocks(_stage_model(model, i), spec,
                                        stage.stage_layers(spec, bounds, k))
        size = stage.weights_nbytes(model.weights)
        _log.info("pipeline %s: layers %s..%s, %.2f MB of %.2f MB parameters (%.0f%%)",
                  self.describe(), spec.names[bounds[held[0]]],
                  spec.names[bounds[held[-1] + 1] - 1], size / 1e6, spec.total_param_bytes / 1e6,
                  100.0 * size / max(1, spec.total_param_bytes))
        if self.zero:
            if self.zero == 3:
                self._check_zero3()
            with self.scope():
                model._pipeline_zero = attach_data_axis(  # noqa: SLF001
                    model, self.zero, self.layout.group(DATA), self.timeout,
                    pipe=self.layout.group(PIPE))
        return self._mark_split(model)

    # ----------------------------------------------------------------- the custom loop
    def train_step(self, model: Any, loss: Any, optimizer: Any) -> Any:
        """The custom-loop path: a ``tf.function`` ``step(x, y, sample_weight=None) -> loss`` of
        one pipelined step.

        Every process calls ``step`` with the same global batch; stage 0 reads ``x``, the last
        stage ``y`` (and the sample weights); each stage applies its own gradients with
        ``optimizer``; the returned loss (the whole model's mean over the global batch, weighted
        as Keras weighs it) is the same on every process.

        Args:
            model: This process's stage, from `build_model`.
            loss: A Keras loss (name, function or object), applied as ``mean(loss(y, y_pred))``.
            optimizer: A Keras optimizer for this stage's variables.

        Example:
            >>> import numpy as np
            >>> keras = flavour.get_keras()
            >>> strategy = PipelineStrategy(micro_batches=2)
            >>> model = strategy.build_model(lambda: keras.Sequential(
            ...     [keras.Input((2,)), keras.layers.Dense(1, name="a")]))
            >>> step = strategy.train_step(model, "mse", keras.optimizers.SGD(0.1))
            >>> float(step(np.ones((4, 2), "float32"), np.zeros((4, 1), "float32"))) >= 0
            True
        """
        keras = flavour.get_keras(flavour.flavour_of(model))
        loss_fn = mean_loss(keras.losses.get(loss))
        engine = model._engine  # noqa: SLF001
        self.check_optimizer(optimizer)
        build_stage_optimizer(model, optimizer, tf.distribute.get_strategy())

        @tf.function
        def step(x: Any, y: Any, sample_weight: Any = None) -> Any:
            self.check_batch(x)
            checks = step_checks(engine.layout, checked_variables(model), x, y, sample_weight,
                                 optimizer.iterations + 1, self.timeout)
            x, y, sample_weight = gated(checks, x, y, sample_weight)
            total, _ = apply_step(model, engine, optimizer, engine.replica_rows(x),
                                  engine.replica_rows(y), loss_fn,
                                  engine.replica_rows(sample_weight))
            value = None
            if engine.layout.is_last:
                value = engine.average_over_replicas(
                    [tf.cast(total, tf.float32)], transport.METRICS, transport.CUSTOM)[0]
            return engine.share(value, [], tf.float32, 0, transport.CUSTOM)

        return step

    # ----------------------------------------------------------------- weights
    def _broadcast_from_first_replica(self, model: Any) -> None:
        """Gives every replica of this stage replica 0's initial weights."""
        group = self.layout.group(DATA)
        for i, variable in enumerate(model.weights):
            transport.broadcast_variable(
                variable, group=group, instance=transport.instance_key(transport.WEIGHTS, 0, i),
                timeout=self.timeout)

