"""One ZeRO training step on a Keras 3 model: gradients summed onto their owners, each owner
updating its part with the model's own optimizer, the updated parts gathered.

`ZeroEngine` is attached to a model by `tfdist.strategies.zero.ZeroStrategy.build_model`. Every
process of the data axis is given the same global batch and takes its rows (1/D). A step:

1. stage 3: gathers each layer's weights just before its forward and its backward and
   reduce-scatters its gradient as soon as it is computed (`tfdist.zero.layerwise`; each layer
   is cut into D parts of its own); a model with a weight outside every layer gathers the whole
   weights at once (`gather_whole`) and runs on them (``keras.StatelessScope``: the model's own
   variables hold no values);
2. runs the model forward and backward on this process's rows (the loss weighed by the rows'
   share, so the D means average to the global batch's mean);
3. sums the gradients onto their owners (`reduce_to_owners`): stage 1 all-reduces every dense
   gradient and keeps its part; stages 2 and 3 reduce-scatter them, so a process receives only
   its part's sums. An embedding's gradient (``IndexedSlices``) stays row slices: the slices of
   every process are gathered and each owner keeps those of its rows, so Keras 3's Adam
   updates exactly as on one process;
4. clips by norm over every part (`clip_pieces`: ``clipnorm`` per whole weight,
   ``global_clipnorm`` over the whole model, both as Keras computes them), then the model's
   optimizer, built on this process's pieces only (its slots are 1/D of the model's), applies
   the gradients, weight decay included;
5. stages 1 and 2: gathers the updated pieces into the model's weights, whole on every process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfdist.compat.models import bind_unbuilt_optimizer, build_optimizer
from tfdist.errors import StrategyConfigError, format_error
from tfdist.parallel.mesh import ProcessGroup
from tfdist.parallel.ops import all_gather, all_reduce, reduce_scatter
from tfdist.zero.layerwise import units
from tfdist.zero.partition import Piece, ZeroPartition, partition, partition_groups
from tfdist.zero.pieces import gradient_values, owner_buffer, piece_rows, take_pieces

__all__ = ["ZeroEngine", "check_partitionable"]


def check_partitionable(variables: Sequence[Any]) -> str:
    """The one dtype of ``variables``; refuses a model ZeRO cannot partition, naming why.

    Raises:
        StrategyConfigError: no trainable weights, or trainable weights of several dtypes (the
            parts travel in one buffer of one dtype).
    """
    if not variables:
        raise StrategyConfigError(format_error(
            "ZeRO partitions a model's trainable weights, and this model has none.",
            received="a model with 0 trainable weights (not built, or all frozen)",
            expected="a built model with trainable weights",
            fix="build the model (keras.Input with a full shape) inside the build function"))
    dtypes = sorted({str(tf.as_dtype(v.dtype).name) for v in variables})
    if len(dtypes) > 1:
        named = ", ".join(f"{v.path}: {tf.as_dtype(v.dtype).name}" for v in variables
                          if tf.as_dtype(v.dtype).name != dtypes[0])
        raise StrategyConfigError(format_error(
            "ZeRO cannot partition trainable weights of several dtypes: each step moves every "
            "part in one buffer of one dtype.",
            received=f"dtypes {dtypes} ({named})",
            expected="every trainable weight of one dtype (mixed precision keeps float32 "
                     "weights)",
            fix="give every layer the same variable dtype, or freeze the odd ones "
                "(layer.trainable = False)"))
    return dtypes[0]


@contextlib.contextmanager
def _recording_slots(optimizer: Any) -> Iterator[list[tuple[Any, int, str]]]:
    """Records each slot ``optimizer`` makes from a reference variable: (slot, index of the
    reference among those built on, slot name). Keras 3 makes every slot this way."""
    made: list[tuple[Any, int, str]] = []
    original = optimizer.add_variable_from_reference
    order: dict[int, int] = {}

    def recording(reference: Any, name: Any = None, *args: Any, **kwargs: Any) -> Any:
        slot = original(reference, name, *args, **kwargs)
        made.append((slot, order.setdefault(id(reference), len(order)), str(name)))
        return slot

    optimizer.add_variable_from_reference = recording
    try:
        yield made
    finally:
        del optimizer.add_variable_from_reference


class ZeroEngine:
    """The ZeRO step of one model on one process of the data axis.

    Args:
        model: The built Keras 3 model (every process builds the same one).
        stage: 1, 2 or 3.
        group: The data axis' group (`tfdist.parallel.mesh.ProcessGroup`).
        timeout: Seconds an eager collective waits (inside a step the step's watchdog rules).
        sabotage: Test-only: ``"skip_gather"`` leaves the updated parts ungathered;
            ``"skip_scatter"`` keeps this process's own gradient rows unreduced.
    """

    def __init__(self, model: Any, stage: int, group: ProcessGroup, timeout: float,
                 sabotage: str | None = None) -> None:
        self.model, self.stage, self.group, self.timeout = model, stage, group, timeout
        self.sabotage = sabotage
        self.variables = list(model.trainable_variables)
        self.dtype = check_partitionable(self.variables)
        # stage 3 gathers layer by layer, and stage 2 reduce-scatters layer by layer, where
        # every weight belongs to a layer: each layer is then cut into D parts of its own
        self.units = units(model, self.variables) if stage >= 2 else None
        shapes = [tuple(v.shape) for v in self.variables]
        itemsize = tf.as_dtype(self.dtype).size
        self.plan: ZeroPartition = partition(shapes, itemsize, group.size) \
            if self.units is None else partition_groups(
                shapes, [sorted(u.variables) for u in self.units], itemsize, group.size)
        self.mine = self.plan.of_owner(group.rank)
        _refuse_empty_parts(self.plan, self.variables)
        self.longest = max(sum(p.size for p in self.plan.of_owner(d))
                           for d in range(group.size))
        # a copy: a slice of a weight may share its buffer, and keep all of it resident
        self.pieces = [keras.Variable(np.array(piece_rows(self.variables[p.variable].value, p,
                                                     self.plan.shapes[p.variable]), copy=True),
                                      name=self.variables[p.variable].name, trainable=True)
                       for p in self.mine]
        self.dropped = False
        self.home = tf.distribute.get_strategy()  # the strategy the pieces live under
        if stage == 3:
            self.drop_whole()

    # ----------------------------------------------------------------- holding
    def drop_whole(self) -> None:
        """Stage 3: the model's trainable weights hold no values (each step gathers them)."""
        for variable in self.variables:  # Keras 3's uninitialised variable (abstract_build's)
            variable._value = None  # noqa: SLF001
            variable._initializer = keras.initializers.Zeros()  # noqa: SLF001 - read symbolically
        self.dropped = True

    def materialize(self) -> None:
        """Stage 3: the model's weights whole again (a collective: every process calls it),
        for saving or evaluating outside a step; `drop_whole` undoes it."""
        whole = self.gather_whole()
        with self.home.scope():  # where the model's variables were made
            for variable, value in zip(self.variables, whole, strict=True):
                if variable._value is None:  # noqa: SLF001
                    variable._initialize(value)  # noqa: SLF001
                else:
                    variable.assign(value)
        self.dropped = False

    def held_bytes(self) -> dict[str, int]:
        """Bytes this process holds: ``weights`` (the model's trainable weights with values),
        ``pieces`` (its parts' master copies), ``slots`` (the optimizer's variables)."""
        itemsize = tf.as_dtype(self.dtype).size
        weights = 0 if self.dropped else sum(int(v.numpy().size) for v in self.variables)
        optimizer = getattr(self.model, "optimizer", None)
        slots = sum(int(v.numpy().nbytes) for v in getattr(optimizer, "variables", []) or [])
        return {"weights": weights * itemsize, "pieces": sum(p.size for p in self.mine) *
                itemsize, "slots": slots}

    def build_optimizer(self, optimizer: Any) -> None:
        """Builds ``optimizer`` on this process's pieces (a no-op once built): its slots are
        1/D of the model's. Weights excluded from weight decay by variable stay excluded. Each
        slot is recorded with its piece and name (`whole_optimizer` gathers them by it)."""
        excluded = getattr(optimizer, "_exclude_from_weight_decay", None)
        if excluded:
            for piece, part in zip(self.pieces, self.mine, strict=True):
                if id(self.variables[part.variable]) in excluded:
                    excluded.add(id(piece))
        bind_unbuilt_optimizer(optimizer, self.home)  # made outside the strategy's scope
        with _recording_slots(optimizer) as slots:
            build_optimizer(optimizer, self.pieces, self.home)
        if slots:
            self.slots = slots

    def take_pieces(self) -> None:
        """This process's pieces from the model's whole weights (after loading them)."""
        for piece, part in zip(self.pieces, self.mine, strict=True):
            whole = self.variables[part.variable]
            piece.assign(np.array(piece_rows(whole.value, part, self.plan.shapes[part.variable]),
                                  copy=True))

    def allocate_whole(self) -> None:
        """Stage 3: room (zeros) for the whole weights, without a collective (to load into)."""
        with self.home.scope():
            for variable, shape in zip(self.variables, self.plan.shapes, strict=True):
                if variable._value is None:  # noqa: SLF001
                    variable._initialize(tf.zeros(shape, self.dtype))  # noqa: SLF001
        self.dropped = False

    def whole_optimizer(self, optimizer: Any) -> Any | None:
        """A copy of ``optimizer`` built on the whole model, its slots gathered from every
        owner's parts and its iterations the same (a collective: every process calls it);
        None if the optimizer's slots are not one per piece and name."""
        recorded = getattr(self, "slots", [])
        names = sorted({name for _, _, name in recorded})
        by_piece = {(index, name): slot for slot, index, name in recorded}
        if not names or any((i, n) not in by_piece for i in range(len(self.pieces))
                            for n in names):
            return None
        whole = type(optimizer).from_config(optimizer.get_config())
        bind_unbuilt_optimizer(whole, self.home)
        with _recording_slots(whole) as targets:
            build_optimizer(whole, self.variables, self.home)
        gathered = {name: self.gather_whole([by_piece[(i, name)] for i in
                                             range(len(self.pieces))]) for name in names}
        for slot, index, name in targets:
            slot.assign(gathered[name][index])
        whole.iterations.assign(optimizer.iterations)
        return whole

    def step_traffic(self) -> dict[str, int]:
        """Bytes each process sends in one step's collectives of dense weights and gradients
        (ring model: an all-reduce of ``b`` bytes sends ``2 (D-1)/D b``, a reduce-scatter or an
        all-gather ``(D-1)/D b``; the buffers are padded to the largest part), against
        ``replicated``: one all-reduce of the gradients. An embedding's row slices are
        gathered besides, in proportion to the batch (not counted). Stage 3 layer by layer
        gathers each layer twice (its forward, its backward) and reduce-scatters it once.

        Example:
            >>> ZeroEngine.step_traffic.__doc__ is not None
            True
        """
        size = self.group.size
        itemsize = tf.as_dtype(self.dtype).size
        share = (size - 1) / size
        if self.units is not None:  # one buffer per layer, padded to its longest part
            buffer = sum(size * max(sum(p.size for p in self.plan.of_owner(d)
                                        if p.variable in unit.variables) for d in range(size))
                         for unit in self.units) * itemsize
            gather = 2 * share * buffer if self.stage == 3 else share * buffer
        else:
            buffer = size * self.longest * itemsize
            gather = share * buffer
        scatter = 2 * share * buffer if self.stage == 1 else share * buffer
        return {"reduce": int(scatter), "gather": int(gather), "sent": int(scatter + gather),
                "replicated": int(2 * share * self.plan.total_bytes)}

    # ------------------------------------------------------------- collectives
    def gather_whole(self, parts: Sequence[Any] | None = None) -> list[Any]:
        """Every trainable weight's whole value, gathered from its owners' pieces (or from
        ``parts``, one tensor per piece of this process, e.g. an optimizer slot's)."""
        whole = self._gather([self.plan.of_owner(d) for d in range(self.group.size)],
                             parts or self.pieces)
        return [whole[i] for i in range(len(self.plan.shapes))]

    def gather_variables(self, variables: Collection[int], parts: Sequence[Any]) -> dict[int, Any]:
        """The whole values of the trainable weights numbered ``variables`` (one layer's),
        gathered from their owners; ``parts``: this process's pieces of them, in its order
        (`pieces_of`). Every process calls it with the same ``variables``."""
        return self._gather([[p for p in self.plan.of_owner(d) if p.variable in variables]
                             for d in range(self.group.size)], parts)

    def pieces_of(self, variables: Collection[int]) -> list[int]:
        """Which of this process's pieces (indices into ``self.pieces``) belong to
        ``variables``."""
        return [k for k, p in enumerate(self.mine) if p.variable in variables]

    def _gather(self, owned: Sequence[Sequence[Piece]], parts: Sequence[Any]) -> dict[int, Any]:
        """All-gathers each owner's ``owned`` pieces (this process's values: ``parts``), padded
        to the longest owner's; returns each weight's whole value by number."""
        longest = max(sum(p.size for p in pieces) for pieces in owned)
        mine = [tf.reshape(tf.convert_to_tensor(v), [-1]) for v in parts]
        flat = tf.concat([*mine, tf.zeros([longest - sum(p.size for p in
                                                         owned[self.group.rank])],
                                          self.dtype)], 0)
        everyone = tf.reshape(all_gather(flat, self.group, timeout=self._timeout()),
                              [self.group.size, longest])
        rows: dict[int, list[Any]] = {}
        for owner, pieces in enumerate(owned):
            offset = 0
            for piece in pieces:
                rows.setdefault(piece.variable, []).append(
                    everyone[owner, offset:offset + piece.size])
                offset += piece.size
        return {i: tf.reshape(tf.concat(r, 0), self.plan.shapes[i]) for i, r in rows.items()}

    def _timeout(self) -> float:
        return self.timeout if tf.executing_eagerly() else 0.0

    def reduce_to_owners(self, gradients: Sequence[Any] | Mapping[int, Any],
                         only: Collection[int] | None = None) -> list[Any]:
        """This process's pieces' gradients, averaged over the data axis (see the module).

        Args:
            gradients: Each trainable weight's gradient (by number: a list of all, or a
                mapping of those in ``only``); None where it has none.
            only: The weights to reduce (one layer's); None: all. Every process passes the
                same, and gets its pieces of them (`pieces_of`'s order).
        """
        size = self.group.size
        numbers = range(len(self.plan.shapes)) if only is None else sorted(only)
        grads = {i: gradients[i] if not isinstance(gradients, Mapping) else gradients.get(i)
                 for i in numbers}
        dense = {i for i, g in grads.items()
                 if g is not None and not isinstance(g, tf.IndexedSlices)}
        summed = tf.zeros([0], self.dtype)
        buffer = owner_buffer(grads, self.plan, dense, size, self.dtype)
        if buffer is not None and self.sabotage == "skip_scatter":  # test-only: local rows
            summed = buffer[self.group.rank]
        elif buffer is not None:
            if self.stage == 1:
                summed = all_reduce(buffer, self.group, "sum",
                                    timeout=self._timeout())[self.group.rank]
            else:
                summed = tf.reshape(reduce_scatter(buffer, self.group,
                                                   timeout=self._timeout()), [-1])
            summed = summed / size
        # every process gathers every sparse gradient (owner or not: the collectives match)
        gathered = {i: self._gather_slices(g) for i, g in grads.items()
                    if isinstance(g, tf.IndexedSlices)}
        return take_pieces(self.mine, self.plan, summed, dense, gathered, grads)

    def _gather_slices(self, gradient: tf.IndexedSlices) -> tuple[Any, Any]:
        """Every process's row slices of one weight's gradient, averaged."""
        values = all_gather(gradient.values, self.group, timeout=self._timeout())
        indices = all_gather(gradient.indices, self.group, timeout=self._timeout())
        return values / self.group.size, indices

    # ---------------------------------------------------------------- clipping
    def clip_pieces(self, gradients: list[Any], optimizer: Any) -> list[Any]:
        """The optimizer's norm clipping with norms over the whole weights (every owner's
        parts), as Keras 3 computes them on one process."""
        if getattr(optimizer, "global_clipnorm", None):
            squares = [tf.reduce_sum(tf.square(gradient_values(g))) for g in gradients
                       if g is not None]
            total = all_reduce(tf.add_n([*squares, tf.zeros([], self.dtype)]), self.group,
                               timeout=self._timeout())
            use_norm = tf.sqrt(total)
            clip = tf.cast(optimizer.global_clipnorm, self.dtype)
            scale = clip * tf.minimum(1.0 / use_norm, 1.0 / clip) + (use_norm - use_norm)
            # ``v * scale`` as Keras writes it: an embedding's row slices come out dense
            return [None if g is None else tf.convert_to_tensor(g) * scale for g in gradients]
        if getattr(optimizer, "clipnorm", None):
            return self._clip_each(gradients, float(optimizer.clipnorm))
        return gradients

    def _clip_each(self, gradients: list[Any], clipnorm: float) -> list[Any]:
        """``tf.clip_by_norm`` (Keras 3's TensorFlow optimizer) of each whole weight."""
        count = len(self.plan.shapes)
        local = tf.zeros([count], self.dtype)
        for piece, g in zip(self.mine, gradients, strict=True):
            if g is not None:
                local += tf.one_hot(piece.variable, count, dtype=self.dtype) * \
                    tf.reduce_sum(tf.square(gradient_values(g)))
        l2sums = all_reduce(local, self.group, timeout=self._timeout())
        clipped = []
        for piece, g in zip(self.mine, gradients, strict=True):
            if g is None:
                clipped.append(g)
                continue
            l2sum = l2sums[piece.variable]
            safe = tf.where(l2sum > 0, l2sum, tf.ones_like(l2sum))
            l2norm = tf.where(l2sum > 0, tf.sqrt(safe), l2sum)
            most = tf.maximum(l2norm, clipnorm)
            clipped.append(_map_values(g, lambda v, m=most: v * clipnorm / m))
        return clipped


def _refuse_empty_parts(plan: ZeroPartition, variables: Sequence[Any]) -> None:
    """Refuses a model with fewer rows than processes: some process would own nothing."""
    empty = [d for d in range(plan.parts) if not plan.of_owner(d)]
    if empty:
        rows = sum(shape[0] if shape else 1 for shape in plan.shapes)
        raise StrategyConfigError(format_error(
            "ZeRO cannot give every process a part: the model's trainable weights have fewer "
            "rows than there are processes.",
            received=f"{len(variables)} trainable weights, {rows} rows in all, "
                     f"D={plan.parts} (processes {empty} would own nothing)",
            expected=f"at least one row per process ({plan.parts} rows)",
            fix="use fewer processes for this model, or drop zero (it is small enough to "
                "replicate)"))


def _map_values(gradient: Any, fn: Any) -> Any:
    """``fn`` applied to a gradient's values (an ``IndexedSlices`` stays one)."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(fn(gradient.values), gradient.indices, gradient.dense_shape)
    return fn(gradient)
