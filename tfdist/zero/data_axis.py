"""ZeRO stages 1 and 2 on the data axis of a model-parallel strategy: the D replicas of a
pipeline stage (``pipeline``) or of a tensor shard (``tensor``) share its optimizer state (and,
stage 2, its summed gradients) instead of each holding all of it.

Each process partitions its own trainable variables (its stage's, or its shard's) by bytes into
D runs (`tfdist.zero.partition`, the same partition on its D replicas, whose variables have the
same shapes), and keeps one Keras variable per piece it owns; the optimizer is built on those
pieces only, so its slots are 1/D of the process's. A step (`DataAxisZero.apply`, inside the
strategy's ``tf.function``, once the process's gradients are summed):

1. the pieces take their rows of the stage's whole weights (which a restore, ``set_weights`` or
   a load may have changed);
2. the gradients reach their owners, averaged over the D replicas: stage 1 all-reduces each
   gradient as the replicated pipeline does and keeps its rows; stage 2 reduce-scatters one
   buffer of the dense gradients, so a process receives only its pieces' sums. An embedding's
   gradient (``IndexedSlices``) stays row slices: every replica's slices are gathered and each
   owner keeps those of its rows, as one device gives them to Keras 3's Adam;
3. norms are taken over every piece of the whole model (``clipnorm`` per whole weight,
   ``global_clipnorm`` over every weight: the squared sums all-reduced over the data axis, then
   a split weight's over its tensor group and everything over the pipeline's stages), then the
   optimizer, its own norm clipping off, applies the clipped pieces' gradients (weight decay,
   its exclusions and ``clipvalue`` are element-wise: exact on a piece);
4. the updated pieces are all-gathered into the process's whole weights: every replica holds
   the same weights again (the strategies' consistency checks compare them).

Stage 3 is `tfdist.zero.data_axis_layers`. Refused before training (`check_zero`,
`check_zero_optimizer`): tf-keras, D = 1,
a pipeline's tensor-split stages, ``use_ema`` and ``gradient_accumulation_steps`` (both keep
per-variable state that Keras swaps or applies outside this step), and weights tied across
pipeline stages under stages 2 and 3 (their gradients are summed whole across stages).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tfdist.errors import StrategyConfigError, format_error
from tfdist.parallel.keys import REDUCE, TRAIN, instance_key
from tfdist.parallel.mesh import ProcessGroup
from tfdist.parallel.ops import all_gather, all_reduce, reduce_scatter
from tfdist.zero.partition import ZeroPartition, partition
from tfdist.zero.pieces import gradient_values, own_slices, owner_buffer, piece_rows, take_pieces

__all__ = ["DataAxisZero", "check_zero", "check_zero_optimizer", "SKIP_GATHER_ENV"]

SKIP_GATHER_ENV = "TFDIST_ZERO_SABOTAGE"
"""Test-only: ``skip_gather`` leaves the updated pieces ungathered (parity must then fail)."""
ZERO_MICRO_BATCH = 2
"""ZeRO's collectives on the data group use REDUCE's named keys of micro-batch 2 (the
replicated gradients use 0, the global norm over the stages 1)."""
BUFFER, WEIGHTS_GATHER, GLOBAL_NORM, WEIGHT_NORMS, SPLIT_NORMS, SPARSE = 0, 1, 2, 3, 4, 16
"""Their indexes: the dense gradients' buffer, the updated pieces' gather, the global squared
norm (a vector of two), each weight's squared norm (a vector: a key keeps one shape for the
job), their sums over a tensor group, and from 16 on sparse gradient ``i``'s values (``16 + 2
i``) and indices (one more)."""


def is_sparse(gradient: Any) -> bool:
    """Whether ``gradient`` is an ``IndexedSlices`` (an embedding-like gradient)."""
    return isinstance(gradient, tf.IndexedSlices)


def check_zero(stage: int, replicas: int, tensor: int, flavour: str,
               strategy: str = "pipeline") -> None:
    """Refuses, before any process waits for another, a ZeRO stage ``strategy`` (``pipeline``
    or ``tensor``) cannot run on its data axis of ``replicas`` (T = ``tensor``).

    Example:
        >>> check_zero(2, 2, 1, "keras3")
        >>> check_zero(3, 2, 2, "keras3", "tensor")
        >>> check_zero(3, 1, 2, "keras3", "tensor")
        Traceback (most recent call last):
        ...
        tfdist.errors.StrategyConfigError: ZeRO shards over the data-parallel replicas, and \
this tensor job has one (D=1): there is nothing to shard. Received: zero=3 with D=1 tensor \
replica(s). Expected: D >= 2: processes = D x K x T. Fix: launch with twice the workers \
(tfdist-launch --workers 4 --stages 2 --zero 3, or --workers 4 --tensor 2), or drop zero
    """
    if flavour == "tf_keras":
        raise StrategyConfigError(format_error(
            "ZeRO builds the optimizer on parts of the weights with Keras 3's API.",
            received=f"zero={stage} with tf-keras (TF_USE_LEGACY_KERAS=1)",
            expected="Keras 3 (TF_USE_LEGACY_KERAS unset)",
            fix="unset TF_USE_LEGACY_KERAS, or drop zero"))
    if replicas < 2:
        raise StrategyConfigError(format_error(
            f"ZeRO shards over the data-parallel replicas, and this {strategy} job has one "
            "(D=1): there is nothing to shard.",
            received=f"zero={stage} with D={replicas} {strategy} replica(s)",
            expected="D >= 2: processes = D x K x T",
            fix="launch with twice the workers (tfdist-launch --workers 4 --stages 2 --zero "
                f"{stage}, or --workers 4 --tensor 2), or drop zero"))
    if tensor > 1 and strategy == "pipeline":
        raise StrategyConfigError(format_error(
            "ZeRO on the pipeline's data axis is not built for tensor-split stages.",
            received=f"zero={stage} with tensor={tensor}",
            expected="tensor=1 (whole stages) with zero",
            fix="drop --tensor, or drop --zero"))


def check_zero_optimizer(optimizer: Any, stage: int, tied: bool) -> None:
    """Refuses an optimizer option (or a model) ZeRO cannot apply as one device would.

    Example:
        >>> import keras
        >>> check_zero_optimizer(keras.optimizers.Adam(global_clipnorm=1.0), 2, tied=False)
    """
    for option in ("use_ema", "gradient_accumulation_steps"):
        value = getattr(optimizer, option, None)
        if value:
            raise StrategyConfigError(format_error(
                f"ZeRO on the pipeline cannot apply {option}={value!r} as one device would: "
                "Keras keeps its per-variable state on the optimizer's variables, which are "
                "this process's parts of the weights, not the weights.",
                received=f"{option}={value!r} ({type(optimizer).__name__}) with zero={stage}",
                expected=f"an optimizer without {option}",
                fix=f"drop {option}, or drop zero"))
    if tied and stage >= 2:
        raise StrategyConfigError(format_error(
            f"ZeRO stage {stage} reduce-scatters each stage's gradients, and a weight tied "
            "across stages needs its whole gradient summed over the stages that hold it.",
            received=f"zero={stage} with weights tied across stages",
            expected=f"no tied weights with zero={stage}",
            fix="use zero=1 (it keeps the whole gradients), or untie the weights"))


class DataAxisZero:
    """ZeRO on one process's variables, over its data group.

    Args:
        variables: The process's trainable variables (in the gradients' order).
        stage: 1 or 2.
        group: The process's data group (D replicas of its stage or shard).
        pipe: The replica's pipeline group (its stages), for the global norm; None: none.
        tensor: The tensor group over which the ``split`` variables are spread; None: none.
        split: Indexes (in ``variables``) of the weights split over ``tensor``.
        timeout: Seconds an eager collective waits (inside a step the step's deadline rules).
        sabotage: Test-only: ``"skip_gather"`` leaves the updated pieces ungathered.
    """

    def __init__(self, variables: Sequence[Any], stage: int, group: ProcessGroup,
                 pipe: ProcessGroup | None = None, tensor: ProcessGroup | None = None,
                 split: frozenset[int] = frozenset(), timeout: float = 0.0,
                 sabotage: str | None = None) -> None:
        import keras

        self.variables, self.stage, self.group, self.pipe = list(variables), stage, group, pipe
        self.tensor, self.split = tensor, split if tensor is not None and tensor.size > 1 \
            else frozenset()
        self.timeout, self.sabotage = timeout, sabotage
        dtypes = {tf.as_dtype(v.dtype) for v in self.variables} or {tf.float32}
        if len(dtypes) != 1:
            raise StrategyConfigError(format_error(
                "ZeRO moves a stage's parts in one buffer of one dtype.",
                received=f"trainable weights of dtypes {sorted(d.name for d in dtypes)}",
                expected="every trainable weight of a stage of one dtype",
                fix="give every layer the same variable dtype, or drop zero"))
        self.dtype = dtypes.pop()
        self.plan: ZeroPartition = partition([tuple(v.shape) for v in self.variables],
                                             self.dtype.size, group.size)
        self.mine = self.plan.of_owner(group.rank)
        empty = [d for d in range(group.size) if not self.plan.of_owner(d)]
        if empty and self.variables:  # none at all (a stage of Flatten): nothing to update
            raise StrategyConfigError(format_error(
                "ZeRO cannot give every replica of this stage a part: its weights have fewer "
                "rows than the stage has replicas.",
                received=f"{len(self.variables)} trainable weights, D={group.size} "
                         f"(data ranks {empty} would own nothing)",
                expected=f"at least {group.size} rows of weights per stage",
                fix="use fewer replicas or stages, or drop zero"))
        self.longest = max(sum(p.size for p in self.plan.of_owner(d))
                           for d in range(group.size))  # 0 without weights: nothing gathered
        self.pieces = [keras.Variable(piece_rows(self.variables[p.variable].numpy(), p,
                                            self.plan.shapes[p.variable]),
                                      name=self.variables[p.variable].name, trainable=True)
                       for p in self.mine]

    # ----------------------------------------------------------------- optimizer
    def build_optimizer(self, optimizer: Any, strategy: Any) -> None:
        """Builds ``optimizer`` on this process's pieces (a no-op once built); a weight
        excluded from weight decay by variable has its pieces excluded."""
        from tfdist.compat.models import bind_unbuilt_optimizer, build_optimizer

        if getattr(optimizer, "built", False):
            return
        excluded = getattr(optimizer, "_exclude_from_weight_decay", None)
        if excluded:
            for piece, part in zip(self.pieces, self.mine, strict=True):
                if optimizer._var_key(self.variables[part.variable]) in excluded:  # noqa: SLF001
                    excluded.add(optimizer._var_key(piece))  # noqa: SLF001
        bind_unbuilt_optimizer(optimizer, strategy)
        build_optimizer(optimizer, self.pieces, strategy)

    def held_bytes(self, optimizer: Any) -> dict[str, int]:
        """Bytes this process holds: ``pieces`` (its parts' master copies) and ``slots`` (the
        optimizer's variables, its step counter and learning rate included)."""
        slots = sum(int(v.numpy().nbytes) for v in getattr(optimizer, "variables", []) or [])
        return {"pieces": sum(p.size for p in self.mine) * self.dtype.size, "slots": slots}

    # ----------------------------------------------------------------- the step
    def apply(self, optimizer: Any, gradients: Sequence[Any],
              average: Callable[[list[Any]], list[Any]],
              combine: Callable[[list[Any]], list[Any]] | None = None) -> None:
        """One update of this process's pieces from its stage's summed ``gradients`` and the
        gather of the stage's whole weights (see the module). ``average`` is the replicated
        average over the data group (stage 1); ``combine`` sums tied weights' gradients."""
        from tfdist.compat.models import clipping_off

        for piece, part in zip(self.pieces, self.mine, strict=True):
            piece.assign(piece_rows(self.variables[part.variable], part,
                               self.plan.shapes[part.variable]))
        if self.stage == 1:
            whole = average(list(gradients))
            if combine is not None:
                whole = combine(whole)
            owned = self._own_rows(whole)
        else:
            owned = self._scatter(list(gradients))
        owned = self._clip(owned, optimizer)
        if not self.pieces:  # a weightless stage: Keras refuses an empty update; count it
            optimizer.iterations.assign_add(1)
        else:
            with clipping_off(optimizer):
                optimizer.apply_gradients(zip(owned, self.pieces, strict=True))
        if self.longest and self.sabotage != "skip_gather":
            for variable, value in zip(self.variables, self.gather_whole(), strict=True):
                variable.assign(value)

    def gather_whole(self) -> list[Any]:
        """Every variable's whole value, gathered from its owners' pieces."""
        mine = [tf.reshape(tf.convert_to_tensor(v), [-1]) for v in self.pieces]
        flat = tf.concat([*mine, tf.zeros([self.longest - sum(p.size for p in self.mine)],
                                          self.dtype)], 0)
        everyone = tf.reshape(all_gather(flat, self.group, instance=self._key(WEIGHTS_GATHER),
                                         timeout=self._timeout()),
                              [self.group.size, self.longest])
        parts: dict[int, list[Any]] = {}
        for owner in range(self.group.size):
            offset = 0
            for piece in self.plan.of_owner(owner):
                parts.setdefault(piece.variable, []).append(
                    everyone[owner, offset:offset + piece.size])
                offset += piece.size
        return [tf.reshape(tf.concat(parts[i], 0), shape)
                for i, shape in enumerate(self.plan.shapes)]

    def _key(self, index: int) -> int:
        return instance_key(REDUCE, ZERO_MICRO_BATCH, index, TRAIN)

    def _timeout(self) -> float:
        return self.timeout if tf.executing_eagerly() else 0.0

    def _own_rows(self, whole: Sequence[Any]) -> list[Any]:
        """This process's pieces of replica-averaged whole gradients (stage 1)."""
        out = []
        for piece in self.mine:
            g = whole[piece.variable]
            if g is None:
                out.append(None)
            elif is_sparse(g):
                out.append(own_slices(g.values, g.indices, piece,
                                      self.plan.shapes[piece.variable]))
            else:
                out.append(piece_rows(g, piece, self.plan.shapes[piece.variable]))
        return out

    def _scatter(self, gradients: list[Any]) -> list[Any]:
        """This process's pieces' gradients, averaged over the data group, from one
        reduce-scatter of the dense ones and a gather of the sparse ones (stage 2)."""
        size = self.group.size
        dense = {i for i, g in enumerate(gradients) if g is not None and not is_sparse(g)}
        summed = tf.zeros([0], self.dtype)
        buffer = owner_buffer(gradients, self.plan, dense, size, self.dtype)
        if buffer is not None:
            summed = tf.reshape(reduce_scatter(buffer, self.group, instance=self._key(BUFFER),
                                               timeout=self._timeout()), [-1]) / size
        gathered = {}
        for i, g in enumerate(gradients):  # every replica gathers every sparse gradient
            if is_sparse(g):
                key = self._key(SPARSE + 2 * i)
                values = all_gather(g.values, self.group, instance=key, timeout=self._timeout())
                indices = all_gather(g.indices, self.group, instance=key + 1,
                                     timeout=self._timeout())
                gathered[i] = (values / size, indices)
        return take_pieces(self.mine, self.plan, summed, dense, gathered,
                           range(len(gradients)))

    # ----------------------------------------------------------------- clipping
    def _over_tensor(self, value: Any, index: int) -> Any:
        """``value`` summed over the tensor group (as is where no weight is split)."""
        if not self.split:
            return value
        return all_reduce(value, self.tensor, instance=self._key(index),  # type: ignore[arg-type]
                          timeout=self._timeout())

    def _clip(self, gradients: list[Any], optimizer: Any) -> list[Any]:
        """Keras 3's norm clipping with norms over whole weights (every owner's pieces) and,
        for ``global_clipnorm``, over every stage of the replica."""
        limit = getattr(optimizer, "global_clipnorm", None)
        if limit:
            local = tf.zeros([2], self.dtype)  # [replicated weights', split weights'] squares
            for piece, g in zip(self.mine, gradients, strict=True):
                if g is not None:
                    square = tf.reduce_sum(tf.square(gradient_values(g)))
                    local += tf.one_hot(int(piece.variable in self.split), 2,
                                        dtype=self.dtype) * square
            both = all_reduce(local, self.group, instance=self._key(GLOBAL_NORM),
                              timeout=self._timeout())
            total = both[0] + self._over_tensor(both[1], SPLIT_NORMS)
            if self.pipe is not None:
                total = all_reduce(total, self.pipe, instance=self._key(GLOBAL_NORM),
                                   timeout=self._timeout())
            norm = tf.sqrt(total)
            clip = tf.cast(limit, self.dtype)
            scale = clip * tf.minimum(1.0 / norm, 1.0 / clip) + (norm - norm)
            # ``g * scale`` as Keras 3 writes it: an embedding's row slices come out dense
            return [None if g is None else tf.convert_to_tensor(g) * scale for g in gradients]
        clipnorm = getattr(optimizer, "clipnorm", None)
        if not clipnorm:
            return gradients
        count = len(self.plan.shapes)
        if not count:  # every replica of a weightless stage: nothing to clip, nothing to sum
            return gradients
        local = tf.zeros([count], self.dtype)
        for piece, g in zip(self.mine, gradients, strict=True):
            if g is not None:
                local += tf.one_hot(piece.variable, count, dtype=self.dtype) * \
                    tf.reduce_sum(tf.square(gradient_values(g)))
        l2sums = all_reduce(local, self.group, instance=self._key(WEIGHT_NORMS),
                            timeout=self._timeout())
        if self.split:  # a split weight's norm: its squares summed over its shards too
            mask = tf.constant([float(i in self.split) for i in range(count)], self.dtype)
            l2sums = l2sums * (1.0 - mask) + self._over_tensor(l2sums * mask, SPLIT_NORMS + 1)
        clipped = []
        for piece, g in zip(self.mine, gradients, strict=True):
            if g is None:
                clipped.append(g)
                continue
            l2sum = l2sums[piece.variable]
            safe = tf.where(l2sum > 0, l2sum, tf.ones_like(l2sum))
            l2norm = tf.where(l2sum > 0, tf.sqrt(safe), l2sum)
            most = tf.maximum(l2norm, clipnorm)
            if is_sparse(g):
                clipped.append(tf.IndexedSlices(g.values * clipnorm / most, g.indices,
                                                g.dense_shape))
            else:
                clipped.append(g * clipnorm / most)
        return clipped
