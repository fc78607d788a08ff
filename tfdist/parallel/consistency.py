"""Checks that the processes of a model-parallel job agree: on their global batches (every
step) and on the weights they should hold alike (the first step, then every few steps).

A model-parallel step is exact only if every process of the job computes on the same global
batch, and the weights a group replicates stay the same on each member. Neither goes wrong
loudly: an unseeded shuffle under the tensor strategy trained to loss 1.754 against 0.115
seeded, with the replicated weights still equal; a pipeline whose stages read different data
trained stage 0's ``x`` against stage 1's ``y`` (loss 4.70 against 0.036); an unseeded
``Dropout`` made the "replicated" LayerNorm weights of two tensor shards differ after 6 steps.
(Keras's own shuffle of arrays, ``fit(x, y)`` with its default ``shuffle=True``, is seeded alike
on every process by `tfdist.compat.shuffle`; a dataset's shuffle is the script's to seed.)

Each process reduces what it holds to a fingerprint (per tensor, in float64: the sum, the sum
of squares, a position-weighted sum, which a reordering changes, and the sum of magnitudes,
the scale), the group all-gathers the fingerprints (a few numbers per tensor), and every
member compares each member's with group rank 0's. Two agree when each number is within
`TOLERANCE` of the tensor's scale: float64 sums of the same tensor reduced in another order
differ by far less, while a different batch or weight differs by far more. A difference fails
the step on every member of the group at once (an assertion inside the step: no member is
left waiting in a later collective), naming the members that differ from rank 0, what differs,
the step and the fix.

Example:
    >>> import tensorflow as tf
    >>> [round(v, 4) for v in fingerprint(tf.constant([[1.0, -2.0]])).numpy().tolist()]
    [-1.0, 5.0, -1.0, 3.0]
    >>> prints = tf.stack([fingerprint(tf.constant([1.0, 2.0])),
    ...                    fingerprint(tf.constant([2.0, 1.0]))])   # one batch, reordered
    >>> disagreeing(prints).numpy().tolist()
    [[False], [True]]
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist.errors import StrategyConfigError, format_error
from tfdist.parallel.mesh import ProcessGroup
from tfdist.parallel.ops import all_gather

__all__ = ["PARTS", "TOLERANCE", "WEIGHT_TOLERANCE", "CHECK_EVERY_ENV", "DEFAULT_CHECK_EVERY",
           "BATCH_FIX", "FUSE_ELEMENTS", "fingerprint", "disagreeing", "assert_agree",
           "check_every", "when_due"]

PARTS = 4
"""Numbers per tensor in a fingerprint: sum, sum of squares, position-weighted sum, sum of
magnitudes."""
TOLERANCE = 1e-11
"""How far two fingerprints of a batch may differ, relative to the tensor's scale (its sum of
magnitudes; its sum of squares for that part): the same data, reduced in another order."""
WEIGHT_TOLERANCE = 1e-6
"""The same for replicated weights: on hosts of different CPUs a matmul may round its last bit
differently; every element of a weight one float32 step apart (6e-8 of its scale) passes, while
the divergence of different random draws fails (measured: over 1e-4 after a step)."""
CHECK_EVERY_ENV = "TFDIST_CHECK_WEIGHTS_EVERY"
"""Environment variable: the replicated weights are compared at the first step and every this
many steps after (0: never)."""
DEFAULT_CHECK_EVERY = 100
BATCH_FIX = ("Every process of a model-parallel job must read the same global batches in the "
             "same order. Fix: seed the shuffle of the input (dataset.shuffle(n, seed=S), or "
             "keras.utils.set_random_seed(S) before building it) and feed every process the same "
             "data")


FUSE_ELEMENTS = 1 << 18
"""Tensors are fingerprinted together (one concatenation, one segment sum: a few graph nodes
for all of them, not a chain of ~20 per tensor) up to this many elements at a time (2 MB of
float64); a larger tensor alone, as before."""


def _numeric(value: Any) -> list[tf.Tensor]:
    tensors = [tf.convert_to_tensor(t) for t in tf.nest.flatten(value)]
    return [t for t in tensors if t.dtype.is_floating or t.dtype.is_integer or t.dtype.is_bool]


def _one(flat: tf.Tensor) -> tf.Tensor:
    size = tf.cast(tf.size(flat), tf.float64)
    position = (tf.range(size, dtype=tf.float64) + 1.0) / (size + 1.0)
    return tf.stack([tf.reduce_sum(flat), tf.reduce_sum(flat * flat),
                     tf.reduce_sum(flat * position), tf.reduce_sum(tf.abs(flat))])


def _fused(flats: list[tf.Tensor]) -> tf.Tensor:
    """`_one` of each of ``flats`` (float64 vectors) with graph nodes for all at once: the
    same numbers (each element's position its index in its own tensor, in the same float64
    arithmetic), summed by segment."""
    if len(flats) == 1:
        return _one(flats[0])
    static = [f.shape[0] for f in flats]
    if None in static:
        sizes = tf.stack([tf.size(f, out_type=tf.int64) for f in flats])
        ends = tf.cumsum(sizes)
        before = ends - sizes - 1  # a tensor's start, less the 1 added to each index
        over = tf.cast(sizes, tf.float64) + 1.0
        total = tf.reduce_sum(sizes)
    else:  # constants: fewer nodes
        ends_np = np.cumsum(np.array(static, np.int64))
        ends = tf.constant(ends_np)
        before = tf.constant(ends_np - np.array(static, np.int64) - 1)
        over = tf.constant(np.array(static, np.float64) + 1.0)
        total = int(ends_np[-1])
    index = tf.range(total, dtype=tf.int64)
    # each element's tensor: how many ends are at or before it (an empty tensor holds none)
    segment = tf.reshape(tf.raw_ops.UpperBound(sorted_inputs=tf.expand_dims(ends, 0),
                                               values=tf.expand_dims(index, 0),
                                               out_type=tf.int64),
                         [-1])
    position = tf.cast(index - tf.gather(before, segment), tf.float64) / tf.gather(over, segment)
    flat = tf.concat(flats, axis=0)
    parts = tf.stack([flat, flat * flat, flat * position, tf.abs(flat)], axis=1)
    return tf.reshape(tf.math.unsorted_segment_sum(parts, segment, len(flats)), [-1])


def fingerprint(value: Any) -> tf.Tensor:
    """`PARTS` float64 numbers per numeric tensor of ``value`` (a tensor or a structure), in
    its flattened order; other tensors (strings) are left out."""
    flats = [tf.reshape(tf.cast(t, tf.float64), [-1]) for t in _numeric(value)]
    chunks: list[list[tf.Tensor]] = []
    held = FUSE_ELEMENTS  # elements of the last chunk; a full one starts the next
    for flat in flats:
        size = flat.shape[0]
        if size is not None and (size > FUSE_ELEMENTS or held + size > FUSE_ELEMENTS):
            chunks.append([])
            held = 0
        elif not chunks:
            chunks.append([])
        chunks[-1].append(flat)
        held += size or 0
    if not chunks:
        return tf.zeros([0], tf.float64)
    prints = [_fused(chunk) for chunk in chunks]
    return prints[0] if len(prints) == 1 else tf.concat(prints, axis=0)


def disagreeing(prints: tf.Tensor, tolerance: float = TOLERANCE) -> tf.Tensor:
    """``[members, tensors]`` booleans: whether member ``m``'s fingerprint of tensor ``i``
    differs from member 0's by more than ``tolerance`` of its scale (``prints``:
    ``[members, PARTS * tensors]``)."""
    prints = tf.reshape(prints, [tf.shape(prints)[0], -1, PARTS])
    first = prints[:1]
    magnitude = tf.maximum(prints[..., 3:], first[..., 3:])
    squares = tf.maximum(tf.abs(prints[..., 1:2]), tf.abs(first[..., 1:2]))
    scale = tf.concat([magnitude, squares, magnitude, magnitude], axis=-1)
    apart = tf.abs(prints - first) > tolerance * scale
    return tf.reduce_any(apart, axis=-1)


def _labels(names: Sequence[str], group: ProcessGroup,
            describe: Callable[[int], str]) -> tf.Tensor:
    return tf.constant([[f"{describe(rank)}: {name}" for name in names]
                        for rank in group.members])


def assert_agree(values: Mapping[str, Any], group: ProcessGroup, step: Any, *, subject: str,
                 fix: str, describe: Callable[[int], str] = lambda rank: f"rank {rank}",
                 instance: int | None = None, timeout: float = 0.0,
                 tolerance: float = TOLERANCE) -> list[Any]:
    """An assertion that every member of ``group`` holds the same ``values`` (name -> tensor
    or structure; None is left out) at ``step``; ``[]`` for a group of one.

    Args:
        values: What to compare, by the name the message gives it.
        group: The members that must agree.
        step: The step number the message names (a tensor is fine).
        subject: What the values are, for the message ("global batch").
        fix: The message's last sentence.
        describe: A job rank's name in the message (its stage, its shard).
        instance: The all-gather's named instance key for no tensors (None: the next traced
            key); it is offset by the number of tensors fingerprinted, so one job that checks
            two models (two shapes of fingerprints) meets two keys: TensorFlow keeps one shape
            per key for the life of the job.
        timeout: Seconds the all-gather may wait (0 inside a traced step: its deadline).
        tolerance: Relative to each tensor's scale (`TOLERANCE`, `WEIGHT_TOLERANCE`).

    Raises:
        InvalidArgumentError: (when run) a member's values differ from rank 0's.
    """
    named = {name: value for name, value in values.items() if value is not None}
    if group.size == 1 or not named:
        return []
    numeric = {name: _numeric(value) for name, value in named.items()}
    names = [name for name, tensors in numeric.items() for _ in tensors]
    if not names:
        return []
    if instance is not None:
        instance += len(names)
    gathered = all_gather(fingerprint(list(numeric.values()))[tf.newaxis], group,
                          instance=instance, timeout=timeout)
    apart = disagreeing(gathered, tolerance)
    differing = tf.gather_nd(_labels(names, group, describe), tf.where(apart))  # a mask's
    me = describe(group.members[group.rank])
    return [tf.debugging.Assert(tf.logical_not(tf.reduce_any(apart)), [
        f"The processes {list(group.members)} of this model-parallel job do not hold the same "
        f"{subject} (this is {me}). Each process whose {subject} differs from that of "
        f"{describe(group.members[0])}, with what differs, then the step:", differing,
        tf.cast(step, tf.int64), f". {fix}"], summarize=16)]


def check_every(environ: Mapping[str, str] | None = None) -> int:
    """The weight check's interval in steps (`CHECK_EVERY_ENV`; 0 turns it off).

    Raises:
        StrategyConfigError: a value that is not a whole number >= 0.

    Example:
        >>> check_every({}), check_every({CHECK_EVERY_ENV: "0"})
        (100, 0)
    """
    text = (os.environ if environ is None else environ).get(CHECK_EVERY_ENV, "").strip()
    if not text:
        return DEFAULT_CHECK_EVERY
    if not text.isdigit():
        raise StrategyConfigError(format_error(
            "The replicated weights' check interval is not a whole number of steps.",
            received=f"{CHECK_EVERY_ENV}={text!r}", expected="an int >= 0 (0: never check)",
            fix=f"set {CHECK_EVERY_ENV}={DEFAULT_CHECK_EVERY}, or unset it"))
    return int(text)


def when_due(step: Any, every: int, build: Callable[[], list[Any]]) -> list[Any]:
    """``build()``'s ops run at step 1 and every ``every`` steps (``[]`` when ``every`` is 0);
    returns what to depend on. Every member of a group runs the same steps, so all of them
    take the same branch, collectives included."""
    if every <= 0:
        return []
    step = tf.cast(step, tf.int64)

    def run() -> tf.Tensor:
        with tf.control_dependencies(build()):
            return tf.constant(True)

    due = tf.logical_or(tf.equal(step, 1), tf.equal(step % every, 0))
    return [tf.cond(due, run, lambda: tf.constant(False))]
