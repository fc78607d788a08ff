"""``"tensor"``: each layer's operators split across T processes (Megatron-style tensor
parallelism), and D data-parallel replicas of that on D x T processes.

Every process runs the same script and is given the same global batches. `TensorStrategy.
build_model` decides which layers to split (`tfdist.tensor.rules`: attention by heads,
feed-forward pairs by columns then rows, embeddings and the output logits by vocabulary;
everything else replicated), prints the plan, and builds this process's shard from the layers'
configs (`tfdist.tensor.build`), so each process allocates only its shards. Activations are
all-reduced inside the split layers over the tensor group (`tfdist.parallel.mappings`), on the
same TensorFlow collective runtime as the pipeline; gradients are averaged over the data group.
A step equals one step of the whole model on the whole global batch.

Processes are placed on a `tfdist.parallel.mesh.Mesh` ``(data=D, pipe=1, tensor=T)``, which
``tfdist-launch`` writes in ``TFDIST_MESH`` (`tfdist.parallel.place`); rank ``r`` (its worker
index) holds shard ``r % T`` of replica ``r // T``.

Example:
    Under ``tfdist-launch --strategy tensor --workers 2`` (``TFDIST_MESH=data=1,pipe=1,tensor=2``)::

        strategy = tfdist.get_strategy("auto")         # tensor, T=2
        model = strategy.build_model(build_model_fn)   # this process's shards
        model.compile(optimizer="adam",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(dataset, epochs=2)                   # the same global batches everywhere
        strategy.save_model(model, "model.keras")      # every process; the chief writes it
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from tfdist.compat import models as keras_compat
from tfdist.core import traits as builtin
from tfdist.options import check_positive_number
from tfdist.parallel.keys import next_key
from tfdist.parallel.mesh import DATA, TENSOR
from tfdist.parallel.ops import DEFAULT_TIMEOUT, broadcast_variable
from tfdist.resilience.pipeline_backup import StepBackupMixin
from tfdist.strategies.base import TfdistStrategyMixin
from tfdist.strategies.initial_weights import shard_initial_weights
from tfdist.strategies.model_parallel import ModelParallelMixin
from tfdist.strategies.startup import resolve_startup_timeout
from tfdist.strategies.zero import attach_data_axis, data_axis_stage
from tfdist.tensor import blocks, nested
from tfdist.tensor import build as shards_of
from tfdist.tensor.model import TensorModel
from tfdist.tensor.plan import TensorPlan, check_coverage
from tfdist.tensor.rules import check_rules, plan_model

__all__ = ["TensorStrategy", "TENSOR_SHARDS_ENV"]

TENSOR_SHARDS_ENV = builtin.TENSOR_SHARDS_ENV
_log = logging.getLogger("tfdist")


class TensorStrategy(StepBackupMixin, ModelParallelMixin, TfdistStrategyMixin,
                     tf.distribute.OneDeviceStrategy):
    """Tensor (and data x tensor) parallelism over the workers of TF_CONFIG.

    Args:
        shards: T, the processes each split layer is spread over (None: the job's mesh,
            ``TFDIST_MESH``, which ``tfdist-launch`` writes; without it
            ``$TFDIST_TENSOR_SHARDS``; else every process). D = processes / T.
        rules: ``{layer-name regex: kind}`` overriding the automatic splits
            (`tfdist.tensor.rules`); kinds ``column``, ``row``, ``heads``, ``vocab``,
            ``output``, ``replicated``.
        timeout_seconds: Deadline of each collective (default 300 s).
        startup_timeout_seconds: Deadline for all processes to join.
        tf_config: The TF_CONFIG to use instead of the environment's.
        zero: ZeRO stage 1, 2 or 3 on the data axis (None: ``$TFDIST_ZERO``, which
            ``tfdist-launch --zero`` writes; else none): each shard's D replicas keep the
            optimizer slots of 1/D of its weights, update that part and all-gather it (stage 2
            also reduce-scatters the gradients; `tfdist.zero.data_axis`); stage 3 keeps 1/D
            of the shard's weights, each layer gathered for its calls
            (`tfdist.zero.data_axis_layers`). D >= 2.

    Raises:
        StrategyConfigError: a shard count that is not a positive int or does not divide the
            processes (raised before any waiting).

    Example:
        >>> strategy = TensorStrategy()   # one process: T=1, plain layers
        >>> strategy.shards, strategy.num_replicas, strategy.mesh
        (1, 1, Mesh(data=1, pipe=1, tensor=1))
    """

    name = "tensor"
    traits = builtin.TENSOR
    per_rank_backups = True  # each process holds different shards
    preemption_saves = True  # every rank votes after each step; on SIGTERM all save there

    def __init__(self, shards: int | None = None, rules: Mapping[str, str] | None = None,
                 timeout_seconds: float | None = None,
                 startup_timeout_seconds: float | None = None,
                 tf_config: str | Mapping[str, Any] | None = None,
                 zero: int | None = None) -> None:
        self._check_keras()
        deadline = check_positive_number(
            "startup_timeout_seconds", resolve_startup_timeout(startup_timeout_seconds))
        self.timeout = float(check_positive_number(
            "timeout_seconds", DEFAULT_TIMEOUT if timeout_seconds is None else timeout_seconds))
        # a function's first batch traces and compiles it too: it may take the start-up deadline
        self.first_step_timeout = max(self.timeout, float(deadline or 0.0))
        cluster, task, self.place = self._job_place(tf_config, shards, self.traits.tensor_default)
        self.rules = check_rules(rules)
        self.zero = data_axis_stage(zero, self.place.size_of(DATA), self.place.size_of(TENSOR),
                                    "keras3", "tensor")
        if self.mesh.size > 1:
            self._join_collectives(deadline, cluster, task, self.place.world())
        super().__init__(self._device())
        self._init_tfdist(cluster, task)
        self.plan: TensorPlan | None = None
        self._abstract: Any = None

    # ----------------------------------------------------------------- surface
    @property
    def rank(self) -> int:
        return self.place.rank

    @property
    def shards(self) -> int:
        """T."""
        return self.place.size_of(TENSOR)

    @property
    def tensor_group(self) -> Any:
        return self.place.group(TENSOR)

    def describe(self) -> str:
        """One line: shard and replica of this process.

        Example:
            >>> TensorStrategy().describe()
            'tensor: shard 0 of 1, replica 0 of 1, chief'
        """
        chief = ", chief" if self.is_chief else ""
        return (f"tensor: shard {self.place.rank_on(TENSOR)} of {self.shards}, replica "
                f"{self.place.rank_on(DATA)} of {self.place.size_of(DATA)}{chief}")

    # ----------------------------------------------------------------- the model
    def plan_model(self, model_or_fn: Any) -> TensorPlan:
        """The plan for a built model or the one a build function makes (no weights); a
        model of blocks is planned through its layer tree (`tfdist.tensor.nested`, before
        the block check `build_model` runs)."""
        if hasattr(model_or_fn, "layers"):
            abstract = model_or_fn
        else:
            with keras_compat.abstract_build():
                abstract = model_or_fn()
            self._abstract = abstract
        keras_compat.refuse_model_shape(abstract, "tensor")
        if nested.is_nested(abstract):
            return nested.plan_nested(abstract, self.shards, self.rules)[0]
        return plan_model(abstract, self.shards, self.rules)

    def build_model(self, model_or_fn: Any) -> Any:
        """This process's shard of the model, ready to ``compile`` and ``fit``.

        Args:
            model_or_fn: A function that builds the whole Keras 3 model (called without
                allocating weights: each process creates only its shards, initialised as its
                slices of what one process draws from the same function and seed, one weight
                drawn whole at a time; `tfdist.strategies.initial_weights`). Or a built model:
                each shard copies its slices of the weights (the whole model then exists once
                per process).

        Returns:
            A `tfdist.tensor.model.TensorModel`.
        """
        built = hasattr(model_or_fn, "layers")
        if self._of_blocks(model_or_fn):
            return self._build_blocks(model_or_fn if built else model_or_fn(), built)
        # the function once (`_of_blocks` called it): the seeds it drew are the model's
        source = model_or_fn if built else self._abstract
        self.plan = self.plan_model(source)
        self._abstract = source
        warning = check_coverage(self.plan, repr(source.name))
        if warning and self.is_chief:
            _log.warning("%s\n%s", warning, self.plan.table())
        tensor = self.tensor_group
        model = shards_of.build_shard(source, self.plan, tensor, self.timeout, TensorModel)
        model.attach(self.plan, tensor, self.data_group,
                     shards_of.vocab_start(self.plan, tensor), self.timeout,
                     first_timeout=self.first_step_timeout)
        if built:
            shards_of.set_layer_weights(
                model, shards_of.shard_weights(model_or_fn, self.plan, tensor.rank))
        else:
            shard_initial_weights(self, model, source)
            self._share_initial_weights(model)
        self._agree_seeds(model)
        if self.is_chief:
            _log.info("%s\n%s", self.describe(), self.plan.table())
        return self._mark_split(self._attach_zero(model))

    def _of_blocks(self, model_or_fn: Any) -> bool:
        """Whether the model holds layers inside its layers (a KerasHub task, custom blocks):
        planned and split through its whole layer tree (`tfdist.tensor.nested`)."""
        if hasattr(model_or_fn, "layers"):
            keras_compat.refuse_model_shape(model_or_fn, "tensor")
            return nested.is_nested(model_or_fn)
        with keras_compat.abstract_build():
            self._abstract = model_or_fn()
        keras_compat.refuse_model_shape(self._abstract, "tensor")
        return nested.is_nested(self._abstract)

    def _build_blocks(self, model: Any, built: bool) -> Any:
        """This process's shard of a model of blocks: the whole model (a copy of ``model``, or
        the build function's, with rank 0's weights), planned, checked block by block, then
        sharded in place (`tfdist.tensor.blocks`)."""
        whole = blocks.copy_model(model) if built else model
        if not built and self.mesh.size > 1:
            for group in (self.tensor_group, self.data_group):
                for variable in whole.weights:
                    broadcast_variable(variable, group=group, instance=next_key(group.key),
                                       timeout=self.timeout)
        plan, units = nested.plan_nested(whole, self.shards, self.rules)
        plan, units, _ = blocks.checked_plan(whole, plan, units, self._agree)
        self.plan, self._abstract = plan, blocks.WholeSource(whole)
        warning = check_coverage(plan, repr(whole.name))
        if self.is_chief:
            _log.log(logging.WARNING if warning else logging.INFO, "%s\n%s",
                     warning or self.describe(), plan.table())
        tensor = self.tensor_group
        shard = blocks.shard_model(whole, plan, units, tensor, self.timeout, TensorModel)
        shard.attach(plan, tensor, self.data_group, shards_of.vocab_start(plan, tensor),
                     self.timeout, first_timeout=self.first_step_timeout)
        self._agree_seeds(shard)
        return self._mark_split(self._attach_zero(shard))

    def _attach_zero(self, model: Any) -> Any:
        """Under ZeRO, the step of `tfdist.zero.data_axis` on the shard's variables."""
        if self.zero:
            split = frozenset(i for i, v in enumerate(model.trainable_weights)
                              if id(v) in model._split_ids)  # noqa: SLF001
            with self.scope():
                model.zero = attach_data_axis(model, self.zero, self.data_group, self.timeout,
                                              tensor=self.tensor_group, split=split)
        return model

    def _agree_seeds(self, model: Any) -> None:
        """Every shard of the tensor group draws the same random numbers in its layers: the
        seed generators' states from shard 0 (an unseeded ``Dropout`` drew its own masks on
        each shard, and the replicated weights after it drifted apart). Data replicas keep
        their own draws, as the rows of one batch do on one process."""
        for state in keras_compat.seed_states(model):
            broadcast_variable(state, group=self.tensor_group,
                               instance=next_key(self.tensor_group.key),
                               timeout=self.timeout)

    def _agree(self, values: Any) -> Any:
        """The maximum of ``values`` over every process (so all keep the same blocks whole)."""
        from tfdist.parallel.mappings import all_reduce_max

        value = tf.constant(values)
        for group in (self.tensor_group, self.data_group):
            value = all_reduce_max(value, group, self.timeout)
        return value.numpy()

    def _share_initial_weights(self, model: Any) -> None:
        """Replicated weights from shard 0, then everything from replica 0."""
        for layer in self.plan.layers:
            for variable, weight in zip(model.get_layer(layer.name).weights, layer.weights,
                                        strict=True):
                if weight.axis is None:
                    broadcast_variable(variable, group=self.tensor_group,
                                       instance=next_key(self.tensor_group.key),
                                       timeout=self.timeout)
        for variable in model.weights:
            broadcast_variable(variable, group=self.data_group,
                               instance=next_key(self.data_group.key),
                               timeout=self.timeout)

    def weight_bytes(self, model: Any) -> int:
        """Bytes of the weights this process holds."""
        return int(sum(v.numpy().nbytes for v in model.weights))

    def train_step(self, model: Any, loss: Any, optimizer: Any) -> Any:
        """The custom-loop path: a ``tf.function`` ``step(x, y, sample_weight=None) -> loss``
        of one step on the global batch (the same on every process).

        Example:
            >>> import keras, numpy as np
            >>> strategy = TensorStrategy()
            >>> model = strategy.build_model(lambda: keras.Sequential(
            ...     [keras.Input((2,)), keras.layers.Dense(1, name="a")]))
            >>> step = strategy.train_step(model, "mse", keras.optimizers.SGD(0.1))
            >>> float(step(np.ones((4, 2), "float32"), np.zeros((4, 1), "float32"))) >= 0
            True
        """
        import keras

        from tfdist.tensor.model import split_loss

        if model.tensor_plan.output_layer is not None:
            loss_fn = split_loss(loss, model.tensor_plan, model.tensor_group, model.vocab_start,
                                 self.timeout)
        else:
            loss_fn = keras.losses.get(loss)
            if not isinstance(loss_fn, keras.losses.Loss):  # "mse": a function of (y, y_pred)
                from keras.src.losses.losses import LossFunctionWrapper

                loss_fn = LossFunctionWrapper(loss_fn)

        def compute_loss(x: Any, y: Any, y_pred: Any, sample_weight: Any) -> Any:
            return loss_fn(y, y_pred, sample_weight=sample_weight)

        model.build_update_optimizer(optimizer)

        @tf.function
        def traced(x: Any, y: Any, sample_weight: Any = None) -> Any:
            return model.apply_step(x, y, sample_weight, compute_loss, optimizer)[0]

        traced_once: list[bool] = []

        def step(x: Any, y: Any, sample_weight: Any = None) -> Any:
            if not tf.executing_eagerly():  # inside the caller's own tf.function
                return traced(x, y, sample_weight)
            model.step_watchdog.arm(first=not traced_once)  # `tfdist.watchdog`
            try:
                return traced(x, y, sample_weight)
            finally:
                model.step_watchdog.disarm()
                traced_once.append(True)

        return step

    # ----------------------------------------------------------------- saving
    def gather_weights(self, model: Any) -> dict[str, list[Any]]:
        """Every layer's whole weights (a collective of the tensor group; under ZeRO stage 3
        each shard first gathered whole from its data replicas, and dropped after)."""
        layered = getattr(model, "layered", None)
        with contextlib.nullcontext() if layered is None else layered.whole():
            return shards_of.gather_weights(model, model.tensor_plan, self.tensor_group,
                                            self.timeout)

    def backup_layout(self) -> dict[str, Any]:
        """What this process's backup depends on: the mesh (its shards are ``1/T`` of a layer,
        of replica ``rank // T``); `tfdist.resilience.claim` refuses any other.

        Example:
            >>> TensorStrategy().backup_layout()
            {'strategy': 'tensor', 'processes': 1, 'data': 1, 'tensor': 1, 'zero': 0}
        """
        return {"strategy": self.name, "processes": self.mesh.size, "data": self.mesh.data,
                "tensor": self.mesh.tensor, "zero": self.zero}

    def assemble(self, model: Any) -> Any | None:
        """The whole model with the trained weights on the chief, None elsewhere (every
        process calls it)."""
        weights = self.gather_weights(model)
        if not self.is_chief:
            return None
        if isinstance(self._abstract, blocks.WholeSource):
            whole = self._abstract.build()
            shards_of.set_layer_weights(whole, weights)
            return whole
        return shards_of.assemble(self._abstract, weights)

