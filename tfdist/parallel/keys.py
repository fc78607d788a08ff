"""Instance keys of the job's collectives: one allocator, two spaces that never meet.

TensorFlow matches the members' halves of one collective by ``(group_key, instance_key)``; a key
used twice in a group with two shapes is refused, and two transfers that share one mix their
tensors. Group keys come from the mesh (`tfdist.parallel.mesh`); every instance key of tfdist
comes from here, as a 31-bit int in one of two spaces:

* **named** (bit 30 clear): ``phase << 27 | kind << 24 | micro_batch << 12 | index``
  (`instance_key`), for transfers that every member names the same way without having traced
  the same code: a pipeline's activations and gradients between stages (``kind`` `ACTIVATION`,
  `GRADIENT`), weights sent to the chief (`WEIGHTS`), averages over a group (`REDUCE`, `SHARE`,
  `METRICS`), tied weights (`TIED`) and the exit and stop votes (`EXIT`). ``phase`` separates
  training, evaluation, prediction and custom-loop steps (`TRAIN`, `EVALUATE`, `PREDICT`,
  `CUSTOM`), whose tensors differ in shape, and the consistency checks (`CHECK`:
  `tfdist.parallel.consistency`, the fingerprints a pipeline compares at each step). A tensor
  whose shape changes from batch to batch (a sequence length) cannot keep one key: TensorFlow
  remembers a key's shape for the life of the job. It travels flat, padded to a size class
  (`capacity`: at most a quarter more elements), on a *sized* key (`sized_key`: `SIZED` and
  above, the top quarter of the keys, over the traced ones; the named fields below it for the
  phases `TRAIN` to `CUSTOM`), the index field holding the class above the tensor's index
  (`WEIGHTS`, always micro-batch 0: the micro-batch field holding it), so a key keeps one
  shape and a job meets at most `SIZE_CLASSES` keys per tensor (a job that builds two models
  gathers both with the same keys);
* **traced** (bit 30 set): ``TRACED | n`` (`next_key`), the ``n``-th collective this process
  traced *in that group* (one count per group key). The tensor-parallel layers use these: every
  member of a group runs the same script and traces the same functions in the same order, so
  the ``n``-th collective of the group gets the same key everywhere, and a retrace (a new shape)
  gets new keys. The count is per group because a process may trace collectives of one of its
  groups that the members of its other groups do not: replica 0 alone gathers the weights to
  the chief (its tensor groups' collectives), and with one count for every group, replica 1's
  next broadcast over the data axis then waited on a key replica 0 had passed (the second model
  of a D x K x T job hung at its first step). A traced collective whose
  shape is not known when traced (a sequence length left open, so one trace serves several)
  takes a block of `SIZE_CLASSES` consecutive traced keys (`next_sized_key`): it travels flat,
  padded to its size class, on the block's key for that class, as the sized keys do.

Example:
    >>> instance_key(GRADIENT, micro_batch=1, index=0)
    33558528
    >>> space(instance_key(EXIT, micro_batch=1)), space(TRACED + 5)
    ('named', 'traced')
"""

from __future__ import annotations

import threading
from typing import Literal

from tfdist.errors import StrategyConfigError, format_error

__all__ = ["SIZED", "SIZE_CLASSES", "SIZED_INDEXES", "capacity", "class_capacity", "sized_key",
           "TIED", "ACTIVATION", "GRADIENT", "WEIGHTS", "REDUCE", "SHARE", "METRICS", "EXIT",
           "TRAIN", "EVALUATE", "PREDICT", "CUSTOM", "CHECK", "TRACED", "STOP_VOTE",
           "instance_key",
           "next_key", "next_sized_key", "space"]

TIED, ACTIVATION, GRADIENT, WEIGHTS, REDUCE, SHARE, METRICS, EXIT = range(8)
"""The kinds of named transfers (3 bits). `TIED`: the sums (and initial copies) of weights tied
across stages (`tfdist.pipeline.tied`), on the pair group of their two holders."""
TRAIN, EVALUATE, PREDICT, CUSTOM, CHECK = range(5)
"""The phases of named transfers (3 bits)."""

SIZED = 3 << 29
"""The first sized key (`sized_key`): the top quarter of the int32 keys, above every traced
one; a sized key is ``SIZED | phase << 27 | kind << 24 | micro_batch << 12 | index``."""
SIZED_INDEXES = 32
"""Tensors of one sized transfer (the index field's low 5 bits; the class above them)."""
SIZE_CLASSES = 128
"""Size classes (`capacity`) a sized key can hold (the index field's high 7 bits)."""

_FIELDS = {"index": 1 << 12, "micro_batch": 1 << 12, "kind": 1 << 3, "phase": 1 << 3}
TRACED = 1 << 30
"""The first traced key: above every named key (the largest is ``TRACED - 1``)."""
_next: dict[int | None, int] = {}
"""Group key -> the next traced key's offset from `TRACED` in that group (shared by `next_key`
and `next_sized_key`)."""
_lock = threading.Lock()


def instance_key(kind: int, micro_batch: int = 0, index: int = 0, phase: int = TRAIN) -> int:
    """The named key of tensor ``index`` of a ``kind`` transfer for ``micro_batch``.

    Raises:
        StrategyConfigError: a field out of its bits (it would collide with another key).

    Example:
        >>> instance_key(ACTIVATION, micro_batch=2, index=1, phase=EVALUATE)
        151003137
    """
    for name, value in (("kind", kind), ("micro_batch", micro_batch), ("index", index),
                        ("phase", phase)):
        if not 0 <= value < _FIELDS[name]:
            raise StrategyConfigError(format_error(
                f"A collective's {name} is out of the bits its instance key gives it.",
                received=f"{name}={value}", expected=f"0 <= {name} < {_FIELDS[name]}",
                fix="use fewer micro-batches or fewer tensors per transfer (at most 4096 each)"
                if name in ("micro_batch", "index") else "this is a tfdist bug: report it"))
    return phase << 27 | kind << 24 | micro_batch << 12 | index


def capacity(elements: int) -> tuple[int, int]:
    """``(size_class, capacity)`` of a flat transfer of ``elements``: below 8 the count itself,
    else the smallest ``m * 2**e`` (``m`` in 4..7) holding them (at most 25% padding).
    `tfdist.parallel.ops.size_class` computes the same in a traced step.

    Example:
        >>> [capacity(n) for n in (0, 7, 8, 9, 17, 640)]
        [(0, 0), (7, 7), (8, 8), (9, 10), (13, 20), (33, 640)]
    """
    if elements < 8:
        return elements, elements
    shift = max((elements - 1).bit_length() - 3, 0)
    mantissa = -(-elements // (1 << shift))
    if mantissa == 8:
        mantissa, shift = 4, shift + 1
    return 8 + 4 * (shift - 1) + mantissa - 4, mantissa << shift



def class_capacity(size_class: int) -> int:
    """The capacity of ``size_class`` (`capacity`'s inverse: the most elements it holds).

    Example:
        >>> [class_capacity(c) for c in (0, 7, 8, 9, 13, 33)]
        [0, 7, 8, 10, 20, 640]
        >>> all(capacity(class_capacity(c)) == (c, class_capacity(c)) for c in range(SIZE_CLASSES))
        True
    """
    if size_class < 8:
        return size_class
    mantissa, shift = (size_class - 8) % 4 + 4, (size_class - 8) // 4 + 1
    return mantissa << shift

def sized_key(kind: int, micro_batch: int = 0, index: int = 0,
              phase: int = TRAIN) -> tuple[int, int]:
    """``(key, stride)``: the sized key of tensor ``index`` for size class 0; class ``c``'s key
    is ``key + c * stride`` (added where the class is known, in the traced step). The class
    sits above the index (stride `SIZED_INDEXES`), or for `WEIGHTS` (micro-batch 0, up to
    4096 weights) in the micro-batch field.

    Raises:
        StrategyConfigError: ``index`` is not below `SIZED_INDEXES` (`WEIGHTS`: 4096).

    Example:
        >>> key, stride = sized_key(ACTIVATION, micro_batch=1, index=2)
        >>> key - instance_key(ACTIVATION, 1, 2) == SIZED, stride, space(key)
        (True, 32, 'sized')
        >>> sized_key(WEIGHTS, index=100)[1]
        4096
    """
    if kind == WEIGHTS:
        return SIZED | _sized_fields(kind, micro_batch, index, phase), _FIELDS["index"]
    if not 0 <= index < SIZED_INDEXES:
        raise StrategyConfigError(format_error(
            "A transfer of tensors whose shapes change from batch to batch holds at most "
            f"{SIZED_INDEXES} of them.", received=f"tensor index {index}",
            expected=f"0 <= index < {SIZED_INDEXES}",
            fix="cut the model where fewer tensors of unknown shape are alive (split_points=)"))
    return SIZED | _sized_fields(kind, micro_batch, index, phase), SIZED_INDEXES


def _sized_fields(kind: int, micro_batch: int, index: int, phase: int) -> int:
    if not 0 <= phase < 4:  # two bits: TRAIN, EVALUATE, PREDICT, CUSTOM
        raise StrategyConfigError(format_error(
            "Only training, evaluation, prediction and custom-loop transfers may be sized.",
            received=f"phase={phase}", expected="0 <= phase < 4",
            fix="this is a tfdist bug: report it"))
    return instance_key(kind, micro_batch, index, phase)


STOP_VOTE = instance_key(EXIT, micro_batch=1)
"""The key of the vote after each step on stopping for SIGTERM, on the world group
(`tfdist.resilience.pipeline_vote`); `tfdist.parallel.runtime.exit_barrier` uses micro-batch 0 of
the same kind."""


def next_key(group_key: int | None = None) -> int:
    """A fresh traced key of group ``group_key`` (the next in this process's trace order of that
    group's collectives; ``None``: a count of its own, for keys no group shares).

    Example:
        >>> a, b = next_key(7), next_key(7)
        >>> b == a + 1 and space(a) == "traced", next_key(8) == TRACED
        (True, True)
    """
    return _take(1, group_key)


def next_sized_key(group_key: int | None = None) -> tuple[int, int]:
    """``(key, stride)``: a block of `SIZE_CLASSES` fresh traced keys of group ``group_key``
    for one traced collective whose shape changes from step to step; size class ``c``
    (`capacity`) travels on ``key + c * stride``.

    Example:
        >>> key, stride = next_sized_key(9)
        >>> next_key(9) == key + SIZE_CLASSES * stride, space(key)
        (True, 'traced')
    """
    return _take(SIZE_CLASSES, group_key), 1


def _take(count: int, group_key: int | None) -> int:
    with _lock:
        offset = _next.get(group_key, 0)
        _next[group_key] = offset + count
    key = TRACED + offset
    if key + count > SIZED:
        raise StrategyConfigError(format_error(
            "This process traced more collectives than instance keys allow.",
            received=f"key {key + count - 1} in group {group_key}",
            expected=f"at most {SIZED - TRACED} traced keys per group",
            fix="retrace less (fixed input shapes), or restart the job"))
    return key


def space(key: int) -> Literal["named", "traced", "sized"]:
    """Which space ``key`` is in."""
    return "sized" if key >= SIZED else "traced" if key >= TRACED else "named"
