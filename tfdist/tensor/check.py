"""Checked before training: each block holding split layers, run whole and split in this one
process, must agree, else it is kept whole.

A split is exact only if the block's own ``call`` treats heads, columns and rows the way the
mappings assume (heads independent of each other, a feed-forward's width element-wise between
up and down). A custom block can break that without any sign in its layers: a learned mixing
across the heads axis, a norm over the feed-forward width. So before the first step
`check_blocks` runs every block the plan splits on a small input drawn from the model's real
inputs (its recorded call arguments on a whole-model forward pass): once whole, and as the T
shards of `tfdist.tensor.inplace` on copies of it, one thread per shard, the group's sums done
here (`LocalGroup`). Outputs, the inputs' gradients and the weights' gradients (the shards'
slices put together) must match the whole block's within `TOLERANCE` of their scale; a block
that does not is kept whole, and the plan says by how much.

Example:
    >>> import keras
    >>> from tfdist.tensor.nested import plan_nested
    >>> class Block(keras.layers.Layer):
    ...     def __init__(self, **kwargs):
    ...         super().__init__(**kwargs)
    ...         self.up, self.down = keras.layers.Dense(8), keras.layers.Dense(4)
    ...     def call(self, x):
    ...         return self.down(keras.ops.softmax(self.up(x)))  # softmax over the width
    >>> inputs = keras.Input((3, 4))
    >>> model = keras.Model(inputs, Block(name="block")(inputs))
    >>> plan, units = plan_nested(model, 2)
    >>> gaps = check_blocks(model, plan, units)
    >>> gaps["block"] > TOLERANCE
    True
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tfdist.compat.models import in_own_thread
from tfdist.tensor.inplace import shard_in_place
from tfdist.tensor.nested import Unit, layer_at, own_weights, walk
from tfdist.tensor.plan import LayerSplit, TensorPlan

__all__ = ["TOLERANCE", "LocalGroup", "sample_inputs", "check_blocks"]

TOLERANCE = 1e-4
"""Largest gap allowed, relative to the largest magnitude of what is compared (float32 sums in
another order differ by ~1e-7 of it; a split that mixes heads by ~1)."""
WAIT_SECONDS = 60.0
"""How long a shard's thread waits for the others at a sum."""


class _Exchange:
    """Where the threads of one check meet to sum (or take the maximum of) their tensors."""

    def __init__(self, size: int, timeout: float) -> None:
        self.barrier = threading.Barrier(size, timeout=timeout)
        self.slots: list[Any] = [None] * size

    def reduce(self, rank: int, x: Any, op: str) -> Any:
        self.slots[rank] = tf.convert_to_tensor(x)
        self.barrier.wait()
        values = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before everyone has read them all
        if op == "max":
            return tf.reduce_max(tf.stack(values), 0)
        total = tf.add_n(values)
        return total / len(values) if op == "mean" else total


class LocalGroup:
    """Shard ``rank`` of ``size`` shards run by threads of this process: the collectives of
    `tfdist.parallel.mappings` sum over the threads instead of the processes."""

    def __init__(self, rank: int, exchange: _Exchange) -> None:
        self.rank, self.exchange = rank, exchange
        self.members = tuple(range(len(exchange.slots)))
        self.key = 0

    @property
    def size(self) -> int:
        return len(self.members)

    def reduce_locally(self, x: Any, op: str) -> Any:
        return self.exchange.reduce(self.rank, x, op)


def sample_inputs(model: Any, batch: int = 2, length: int = 5, seed: int = 0) -> Any:
    """A small batch shaped like ``model``'s inputs: unknown lengths ``length``; integer inputs
    drawn below the smallest vocabulary of its embeddings, a ``*mask*`` input ones with the
    last position of the second row off; float inputs normal."""
    rng = np.random.default_rng(seed)
    vocab = min([int(layer.input_dim) for _, layer in walk(model)
                 if isinstance(getattr(layer, "input_dim", None), int)] or [2])

    def draw(spec: Any) -> np.ndarray:
        shape = tuple(batch if i == 0 else (length if d is None else int(d))
                      for i, d in enumerate(spec.shape))
        dtype = str(spec.dtype)
        if "int" in dtype or "bool" in dtype:
            if "mask" in spec.name:
                value = np.ones(shape, "int32")
                value[-1, ..., -1] = 0
            else:
                value = rng.integers(0, vocab, shape)
            return value.astype(dtype)
        return rng.standard_normal(shape).astype(dtype)

    return tf.nest.map_structure(draw, model._inputs_struct)


def _record_calls(model: Any, paths: list[str], sample: Any) -> dict[str, tuple[Any, Any]]:
    """Each block's first call's ``(args, kwargs)`` on a whole-model forward pass."""
    calls: dict[str, tuple[Any, Any]] = {}
    for path in paths:
        block = layer_at(model, path)
        original = block.call

        def record(*args: Any, _path: str = path, _call: Any = original, **kwargs: Any) -> Any:
            calls.setdefault(_path, (args, kwargs))
            return _call(*args, **kwargs)

        block.call = record
    try:
        model(sample, training=False)
    finally:
        for path in paths:
            del layer_at(model, path).call
    return calls


def _floats(values: Any) -> list[Any]:
    return [v for v in tf.nest.flatten(values)
            if tf.is_tensor(v) and v.dtype.is_floating]


def _run(block: Any, args: Any, kwargs: Any, seed: int) -> tuple[list[Any], list[Any], list[Any]]:
    """Outputs, input gradients and weight gradients of ``sum(outputs * fixed noise)``."""
    inputs = _floats(args)
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        outputs = _floats(block(*args, **kwargs))
        noise = [tf.random.stateless_normal(tf.shape(o), (seed, i), dtype=o.dtype)
                 for i, o in enumerate(outputs)]
        total = tf.add_n([tf.reduce_sum(o * n) for o, n in zip(outputs, noise, strict=True)])
    grads = tape.gradient(total, inputs + list(block.trainable_weights))
    grads = [None if g is None else tf.convert_to_tensor(g) for g in grads]
    return outputs, grads[:len(inputs)], grads[len(inputs):]


def _relative(got: list[Any], want: list[Any]) -> float:
    # one pair at a time in float64: all at once held two float64 copies of every gradient of
    # a block (GPT-2 768: 112 MB, most of the check's peak)
    pairs = [(a, b) for a, b in zip(got, want, strict=True) if a is not None and b is not None]
    if not pairs:
        return 0.0
    scale = max(float(np.max(np.abs(np.asarray(b)), initial=0.0)) for _, b in pairs) or 1.0
    return max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)),
                            initial=0.0)) for a, b in pairs) / scale


def _local_plan(model: Any, plan: TensorPlan, units: tuple[Unit, ...], path: str
                ) -> tuple[TensorPlan, tuple[Unit, ...], dict[int, int | None]]:
    """The block's part of the plan with paths relative to it, and each of its variables'
    split axis (by id)."""
    prefix = path + "/"
    entries = [e for e in plan.layers if e.name.startswith(prefix)]
    axes = {id(v): w.axis for e in entries
            for v, w in zip(own_weights(layer_at(model, e.name)), e.weights, strict=True)}

    def strip(name: str | None) -> str | None:
        return None if name is None else name[len(prefix):]

    local = TensorPlan(plan.shards, tuple(
        LayerSplit(strip(e.name), e.class_name, e.kind, e.reason, e.weights) for e in entries))
    mine = tuple(Unit(u.kind, None, tuple(strip(p) for p in u.paths), strip(u.owner), u.heads,
                      u.kv_heads, u.kv_whole) for u in units if u.block == path)
    return local, mine, axes


def _structural_copy(value: Any, memo: dict[int, Any]) -> Any:
    """``value`` with every layer below it a new object and every variable a new one holding
    the same value; other objects shared. Neither ``get_config`` (some KerasHub blocks' fails
    once built) nor a build (a symbolic trace and every initializer: most of a check's time)."""
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, keras.Variable):
        new = keras.Variable(value.numpy(), dtype=value.dtype, trainable=value.trainable,
                             name=value.name.split(":")[0])
        new._path = value.path
    elif isinstance(value, keras.layers.Layer):
        new = object.__new__(type(value))
        memo[id(value)] = new
        new.__dict__.update({key: _structural_copy(item, memo)
                             for key, item in vars(value).items()})
    elif isinstance(value, list | tuple):
        new = type(value)(_structural_copy(item, memo) for item in value)
    elif isinstance(value, dict):
        new = {key: _structural_copy(item, memo) for key, item in value.items()}
    else:
        return value
    memo[id(value)] = new
    return new


def _shard_runs(block: Any, call: tuple[Any, Any], local: TensorPlan,
                units: tuple[Unit, ...]) -> list[Any]:
    """The T shards' ``_run`` results on copies of ``block``, one thread each."""
    args, kwargs = call
    exchange = _Exchange(local.shards, WAIT_SECONDS)
    results: list[Any] = [None] * local.shards
    copies = []
    for rank in range(local.shards):  # one whole copy at a time: each is sliced at once
        copies.append(_structural_copy(block, {}))
        shard_in_place(copies[-1], local, units, LocalGroup(rank, exchange))

    def work(rank: int) -> None:
        try:
            results[rank] = _run(copies[rank], args, kwargs, seed=1)
        except BaseException as error:  # reported as the block's failure
            results[rank] = error
            exchange.barrier.abort()

    threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in range(len(copies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_SECONDS * 4)
    return results


def _gap(block: Any, call: tuple[Any, Any], local: TensorPlan, units: tuple[Unit, ...],
         axes: Mapping[int, int | None]) -> float:
    # in a thread of its own like the shards: a strategy scope entered by this thread (or left
    # entered by earlier code) would run the whole block under it, and the shards without it
    outputs, inputs, weights = in_own_thread(lambda: _run(block, *call, seed=1),
                                             "tfdist-check-whole")
    shards = _shard_runs(block, call, local, units)
    failed = [r for r in shards if not isinstance(r, tuple)]
    if failed:
        raise RuntimeError(f"a shard failed: {failed[0]!r}")
    gap = 0.0
    for got_out, got_in, _ in shards:
        gap = max(gap, _relative(got_out, outputs), _relative(got_in, inputs))
    got, want = [], []  # a split weight's gradient put together; a whole one's on each shard
    for i, variable in enumerate(block.trainable_weights):
        axis = axes.get(id(variable))
        pieces = [s[2][i] for s in shards]
        if axis is None or any(p is None for p in pieces):
            got.extend(pieces)
            want.extend([weights[i]] * len(pieces))
        else:
            got.append(tf.concat(pieces, axis))
            want.append(weights[i])
    return max(gap, _relative(got, want))


def check_blocks(model: Any, plan: TensorPlan, units: tuple[Unit, ...],
                 sample: Any = None) -> dict[str, float]:
    """Each checked block's gap between whole and split (relative; `TOLERANCE` passes).

    Args:
        model: The whole model (built, before `shard_in_place`); left as it was.
        plan: `tfdist.tensor.nested.plan_nested`'s plan for T shards.
        units: Its units (those with a ``block`` are checked).
        sample: The model's inputs (default: `sample_inputs`).

    Returns:
        ``{block path: gap}``; ``inf`` for a block that could not be copied or run split.
    """
    blocks = sorted({u.block for u in units if u.block is not None})
    if plan.shards == 1 or not blocks:
        return {}
    calls = _record_calls(model, blocks, sample_inputs(model) if sample is None else sample)
    gaps: dict[str, float] = {}
    # The shards' copies of a block are cycles of layers: without a collection each block's
    # stayed until Python's next (GPT-2 768 x 4 at T=2: the check's peak 311 MB above the
    # model's, above a shard's training peak). With what the process held before the check
    # frozen, those collections look at what the check made only: 0.05 CPU-s a block of
    # the tiny GPT-2 in a process holding TensorFlow, Keras and KerasHub, not 0.3.
    freezing = gc.get_freeze_count() == 0  # another freeze (a fork server's) stays as it was
    if freezing:
        gc.freeze()
    try:
        for path in blocks:
            if path not in calls:
                gaps[path] = float("inf")
                continue
            local, mine, axes = _local_plan(model, plan, units, path)
            try:
                gaps[path] = _gap(layer_at(model, path), calls[path], local, mine, axes)
            except Exception:  # noqa: BLE001 - a block the split cannot run is kept whole
                gaps[path] = float("inf")
            gc.collect()
    finally:
        if freezing:
            gc.unfreeze()
    return gaps
