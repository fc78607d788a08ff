"""The Keras model a tensor-parallel process trains: its shard, with the steps that keep the
shards in step.

`TensorModel` is a functional ``keras.Model`` of one shard (`tfdist.tensor.build.build_shard`).
Every process of the job is given the same global batches. A training step:

0. checks that it is so over the whole job, and, at the first step and every few steps, that
   the replicated weights are the same on every shard and every replica
   (`tfdist.parallel.consistency`);
1. takes this data replica's rows of the batch (``D`` replicas: ``1/D`` of the rows each);
2. runs the shard forward and backward: the split layers' collectives (`tfdist.tensor.
   collectives`) make every shard's gradients exact, and the replicated variables' gradients
   the same on every shard;
3. averages the gradients over the data axis (an ``Embedding``'s gradient stays row slices, so
   Keras 3's Adam updates as it would on one process) and applies them.

Norm clipping (``clipnorm``, ``global_clipnorm``) is computed over the whole split variables
(`tfdist.tensor.clipping`), then the optimizer applies the clipped gradients. ``compile`` swaps
a vocabulary-split output's loss for the vocab-parallel cross-entropy; ``predict`` gathers the
vocabulary-split logits.
"""

from __future__ import annotations

import contextlib
from typing import Any

import keras
import tensorflow as tf

from tfdist.compat.models import bind_unbuilt_optimizer, build_optimizer, clipping_off
from tfdist.errors import StrategyConfigError, format_error
from tfdist.parallel import consistency
from tfdist.parallel.mappings import all_reduce_sum, gather_axis, gather_last_axis
from tfdist.parallel.mesh import ProcessGroup, world_group
from tfdist.parallel.ops import op_timeout
from tfdist.tensor.clipping import clip_each, clip_global
from tfdist.tensor.loss import VocabParallelCrossEntropy
from tfdist.tensor.nested import entry_variables
from tfdist.tensor.plan import TensorPlan
from tfdist.watchdog import StepWatchdog, with_deadline

__all__ = ["TensorModel", "split_loss"]

_WEIGHTS_FIX = ("The weights every shard of a tensor group (or every data replica) holds alike "
                "have drifted apart: the processes drew different random numbers in a "
                "replicated layer (a random op outside the seed generator of a Keras layer, e.g. "
                "tf.random.uniform in call), or the weights were changed on some processes only "
                "(set_weights or a restore on one process). Fix: draw random numbers in layers "
                "through keras.random with the SeedGenerator of the layer, and change weights on "
                "every process alike")


def split_loss(loss: Any, plan: TensorPlan, group: ProcessGroup, start: int,
               timeout: float) -> Any:
    """The loss for a model whose output logits are split by vocabulary: the vocab-parallel
    cross-entropy in place of ``SparseCategoricalCrossentropy(from_logits=True)``."""
    keras_loss = keras.losses.get(loss) if isinstance(loss, str) else loss
    config = keras_loss.get_config() if hasattr(keras_loss, "get_config") else {}
    if not (isinstance(keras_loss, keras.losses.SparseCategoricalCrossentropy)
            and config.get("from_logits") and config.get("ignore_class") is None):
        raise StrategyConfigError(format_error(
            f"Layer {plan.output_layer!r} gives logits split by vocabulary, whose loss tfdist "
            "computes on the shards: only sparse softmax cross-entropy from logits.",
            received=f"loss={loss!r}",
            expected="keras.losses.SparseCategoricalCrossentropy(from_logits=True)",
            fix=f"use that loss, or keep the output whole: rules={{{plan.output_layer!r}: "
            "'replicated'}"))
    return VocabParallelCrossEntropy(group, start, timeout, reduction=keras_loss.reduction)


class TensorModel(keras.Model):
    """One shard of a tensor-parallel model (built by `TensorStrategy.build_model`).

    Attributes:
        zero: Under ZeRO, the step that updates this process's part of the shard's weights
            (`tfdist.zero.data_axis.DataAxisZero`); None: every replica updates them whole.
    """

    zero: Any = None

    def attach(self, plan: TensorPlan, tensor: ProcessGroup, data: ProcessGroup, start: int,
               timeout: float, first_timeout: float | None = None) -> None:
        """Records the plan and groups (not part of the model's config)."""
        self.tensor_plan, self.tensor_group, self.data_group = plan, tensor, data
        self.vocab_start, self.tensor_timeout = start, timeout
        replicas = f" and its {data.size} data replicas" if data.size > 1 else ""
        self.step_watchdog = StepWatchdog(timeout, f"tensor group of {tensor.size}{replicas}",
                                          first_seconds=first_timeout)
        self._home_strategy = tf.distribute.get_strategy()  # where the shard's variables live
        self._split_ids = {id(variable) for layer in plan.layers
                           for variable, weight in zip(entry_variables(self, layer),
                                                       layer.weights, strict=True)
                           if weight.axis is not None}
        self.world_group = world_group(tensor.size * data.size,
                                       tensor.members[tensor.rank])
        self.check_every = consistency.check_every()

    def describe_rank(self, rank: int) -> str:
        """A job rank's name in the consistency checks' messages."""
        shards = self.tensor_group.size
        return f"rank {rank} (shard {rank % shards} of replica {rank // shards})"

    def consistency_checks(self, x: Any, y: Any, sample_weight: Any, step: Any) -> list[Any]:
        """The step's checks (`tfdist.parallel.consistency`): the global batch the same on
        every process of the job; at step 1 and every `check_every` steps, the replicated
        weights the same on every shard of the tensor group and every weight the same on every
        replica of the data group."""
        timeout = op_timeout(self.tensor_timeout)
        checks = consistency.assert_agree(
            {"x": x, "y": y, "sample_weight": sample_weight}, self.world_group, step,
            subject="global batch", fix=consistency.BATCH_FIX, describe=self.describe_rank,
            timeout=timeout)

        def weights() -> list[Any]:
            if self.layered is not None:  # ZeRO stage 3: each process holds its own part
                return []
            trainable = self.trainable_weights
            replicated = {v.path: v for v in trainable if id(v) not in self._split_ids}
            same = {"fix": _WEIGHTS_FIX, "describe": self.describe_rank, "timeout": timeout,
                    "tolerance": consistency.WEIGHT_TOLERANCE}
            return [*consistency.assert_agree(replicated, self.tensor_group, step,
                                              subject="replicated weights", **same),
                    *consistency.assert_agree({v.path: v for v in trainable}, self.data_group,
                                              step, subject="weights of a data replica", **same)]

        return checks + consistency.when_due(step, self.check_every, weights)

    def compile(self, optimizer: Any = "rmsprop", loss: Any = None, metrics: Any = None,
                **kwargs: Any) -> None:
        optimizer = keras.optimizers.get(optimizer)
        if self.tensor_plan.output_layer is not None and loss is not None:
            if metrics:
                raise StrategyConfigError(format_error(
                    "Metrics cannot read logits split by vocabulary.",
                    received=f"metrics={metrics!r}", expected="metrics=None",
                    fix="evaluate the loss only, or keep the output whole: rules="
                    f"{{{self.tensor_plan.output_layer!r}: 'replicated'}}"))
            loss = split_loss(loss, self.tensor_plan, self.tensor_group, self.vocab_start,
                              self.tensor_timeout)
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)
        # compile inside strategy.scope() (as scripts for the other strategies do): the
        # optimizer's slots go where the shard's plain variables are.
        bind_unbuilt_optimizer(self.optimizer, self._home_strategy)
        if self.zero is not None:
            from tfdist.zero.data_axis import check_zero_optimizer

            check_zero_optimizer(self.optimizer, self.zero.stage, tied=False)

    def build_update_optimizer(self, optimizer: Any) -> None:
        """Builds ``optimizer`` (if not yet) on what a step updates: the shard's trainable
        variables, or under ZeRO this process's parts of them."""
        if self.zero is not None:
            from tfdist.zero.data_axis import check_zero_optimizer

            check_zero_optimizer(optimizer, self.zero.stage, tied=False)
            self.zero.build_optimizer(optimizer, self._home_strategy)
        else:
            build_optimizer(optimizer, self.trainable_variables, self._home_strategy)

    # ------------------------------------------------- the steps' deadline
    def _with_deadline(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                       position: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return with_deadline(args, kwargs, position, self.step_watchdog)

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = self._with_deadline(args, kwargs, 5)
        self.build_update_optimizer(self.optimizer)
        return super().fit(*args, **kwargs)

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = self._with_deadline(args, kwargs, 6)
        return super().evaluate(*args, **kwargs)

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = self._with_deadline(args, kwargs, 4)
        return super().predict(*args, **kwargs)

    # ------------------------------------------------------------------- steps
    def replica_rows(self, value: Any) -> Any:
        """This data replica's rows of a global batch (the whole batch when D = 1): replica
        ``d`` of D takes rows ``[n d // D, n (d + 1) // D)``, so every row of an uneven
        batch is some replica's (`replica_share` weighs each replica's loss by its rows)."""
        group = self.data_group
        if value is None or group.size == 1:
            return value

        def rows(t: Any) -> Any:
            n = tf.shape(t)[0]
            return t[n * group.rank // group.size:n * (group.rank + 1) // group.size]

        return tf.nest.map_structure(rows, value)

    def replica_share(self, x: Any) -> Any:
        """D x this replica's share of the global batch's rows (1.0 where they split evenly):
        its mean loss times this, averaged over the D replicas, is the whole batch's mean.

        Raises:
            InvalidArgumentError: (at the step) a batch with fewer rows than replicas.
        """
        group = self.data_group
        n = tf.shape(tf.nest.flatten(x)[0])[0]
        if group.size == 1:
            return tf.constant(1.0)
        with tf.control_dependencies([tf.debugging.assert_greater_equal(
                n, group.size, message=f"A global batch has fewer rows than the {group.size} "
                "data-parallel replicas of the tensor strategy. Fix: batch at least that many "
                "rows (drop_remainder=True drops a short last batch)")]):
            rows = n * (group.rank + 1) // group.size - n * group.rank // group.size
        return tf.cast(rows * group.size, tf.float32) / tf.cast(n, tf.float32)

    def average_gradients(self, gradients: list[Any]) -> list[Any]:
        """Each gradient's mean over the data axis; row slices stay row slices."""
        group = self.data_group
        if group.size == 1:
            return gradients
        averaged = []
        for g in gradients:
            if isinstance(g, tf.IndexedSlices):
                averaged.append(tf.IndexedSlices(
                    gather_axis(g.values, 0, group, self.tensor_timeout) / group.size,
                    gather_axis(g.indices, 0, group, self.tensor_timeout), g.dense_shape))
            elif g is not None:
                averaged.append(all_reduce_sum(g, group, self.tensor_timeout) / group.size)
            else:
                averaged.append(g)
        return averaged

    def clip(self, gradients: list[Any], optimizer: Any) -> list[Any]:
        """The optimizer's norm clipping, with norms over the whole (split) variables."""
        split = [id(v) in self._split_ids for v in self.trainable_weights]
        args = (self.tensor_group, self.tensor_timeout)
        if getattr(optimizer, "global_clipnorm", None):
            return clip_global(gradients, split, optimizer.global_clipnorm, *args)
        if getattr(optimizer, "clipnorm", None):
            return clip_each(gradients, split, optimizer.clipnorm, *args)
        return gradients

    def apply_step(self, x: Any, y: Any, sample_weight: Any, compute_loss: Any,
                   optimizer: Any) -> Any:
        """One step on this replica's rows; returns the global batch's loss."""
        checks = self.consistency_checks(x, y, sample_weight, optimizer.iterations + 1)
        with tf.control_dependencies(checks):  # no step on batches or weights that differ
            x = tf.nest.map_structure(tf.identity, x)
        share = self.replica_share(x)
        x, y, sample_weight = (self.replica_rows(v) for v in (x, y, sample_weight))
        with tf.GradientTape() as tape, self.layer_gathers():
            y_pred = self(x, training=True)
            loss = compute_loss(x, y, y_pred, sample_weight)
            loss = loss * tf.cast(share, loss.dtype)
        if self.layered is not None:  # ZeRO stage 3: the parts' gradients, already reduced
            self.layered.apply(optimizer, tape.gradient(loss, self.layered.targets()))
        elif self.zero is not None:  # ZeRO on the data axis: norms over every replica's part
            self.zero.apply(optimizer, tape.gradient(loss, self.trainable_weights),
                            self.average_gradients)
        else:
            gradients = tape.gradient(loss, self.trainable_weights)
            gradients = self.clip(self.average_gradients(gradients), optimizer)
            with clipping_off(optimizer):
                optimizer.apply_gradients(zip(gradients, self.trainable_weights, strict=True))
        if self.data_group.size > 1:
            loss = all_reduce_sum(loss, self.data_group, self.tensor_timeout) / \
                self.data_group.size
        return loss, y_pred, (x, y, sample_weight)

    def train_step(self, data: Any) -> Any:
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)

        def compute_loss(x: Any, y: Any, y_pred: Any, sample_weight: Any) -> Any:
            return self._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                      training=True)

        rows = tf.shape(tf.nest.flatten(x)[0])[0]  # the global batch's
        loss, y_pred, (x, y, sample_weight) = self.apply_step(
            x, y, sample_weight, compute_loss, self.optimizer)
        self._loss_tracker.update_state(loss, sample_weight=rows)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The shard's call; refused eagerly when the output logits are split by vocabulary:
        this process would return its slice of them as if they were the model's."""
        if self.tensor_plan.output_layer is not None and tf.executing_eagerly() and not \
                isinstance(tf.nest.flatten(args[:1])[0] if args else None, keras.KerasTensor):
            raise StrategyConfigError(format_error(
                f"model(x) on a shard returns this process's slice of the logits (layer "
                f"{self.tensor_plan.output_layer!r} is split by vocabulary), not the model's.",
                received="model(x) called eagerly on a tensor-parallel shard",
                expected="model.predict(x) on every process",
                fix="call model.predict(x) on every process: it gathers the whole logits"))
        return super().__call__(*args, **kwargs)

    @property
    def layered(self) -> Any:
        """Under ZeRO stage 3 (`tfdist.zero.data_axis_layers`), its step; else None."""
        return self.zero if getattr(self.zero, "stage", 0) == 3 else None

    def layer_gathers(self) -> Any:
        """Under ZeRO stage 3, each layer gathers its weights for its calls while entered."""
        return contextlib.nullcontext() if self.layered is None else self.layered.layerwise()

    def test_step(self, data: Any) -> Any:
        with self.layer_gathers():
            return super().test_step(data)

    def predict_step(self, data: Any) -> Any:
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        with self.layer_gathers():
            y_pred = self(x, training=False)
        if self.tensor_plan.output_layer is None:
            return y_pred
        return gather_last_axis(y_pred, self.tensor_group, self.tensor_timeout)
