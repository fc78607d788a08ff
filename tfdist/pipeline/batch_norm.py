"""BatchNormalization found anywhere in a stage, nested layers and models included.

With M > 1 micro-batches a BatchNormalization normalises each micro-batch by its own statistics
(and updates its moving averages M times a step): not what one device does on the whole batch.
The pipeline refuses it by default; ``batch_norm="per_micro_batch"`` (GPipe's behaviour) is the
explicit opt-in. The split checks the model's top-level layers by class; `find` walks every
sublayer of a built stage (custom layers' attributes, nested models), and `refusal` is the error
both give.

Example:
    >>> from tfdist.core.flavour import get_keras
    >>> keras = get_keras()
    >>> inner = keras.Sequential([keras.layers.Dense(2), keras.layers.BatchNormalization(
    ...     name="hidden_bn")], name="block")
    >>> model = keras.Sequential([keras.Input((3,)), inner], name="outer")
    >>> find(model)
    ['block/hidden_bn']
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.python.ops import collective_ops

from tfdist.errors import StrategyConfigError, format_error
from tfdist.parallel.keys import REDUCE, TRAIN, instance_key
from tfdist.parallel.mesh import ProcessGroup
from tfdist.pipeline.partition import BATCH_NORM_FIX

__all__ = ["find", "is_batch_norm", "refusal", "check_stage", "COUNT_KEY", "BATCH_NORM_FIX"]

COUNT_KEY = instance_key(REDUCE, 2, 0, TRAIN)
"""The instance key of the all-reduce that counts the stages' BatchNormalization layers."""


def is_batch_norm(layer: Any) -> bool:
    """Whether ``layer`` is a BatchNormalization of either Keras (or a subclass: SyncBatchNorm)."""
    return any(cls.__name__ in ("BatchNormalization", "SyncBatchNormalization")
               for cls in type(layer).__mro__)


def _children(layer: Any) -> list[Any]:
    """The layers ``layer`` holds directly (both Kerases track them as attributes)."""
    found = layer._flatten_layers(include_self=False, recursive=False)  # noqa: SLF001
    return list(found)


def find(model: Any) -> list[str]:
    """The paths (``outer/inner/bn``, from below ``model``) of every BatchNormalization in it."""
    paths: list[str] = []
    seen: set[int] = set()

    def walk(layer: Any, prefix: str) -> None:
        for child in _children(layer):
            if id(child) in seen:
                continue
            seen.add(id(child))
            path = f"{prefix}{child.name}"
            if is_batch_norm(child):
                paths.append(path)
            walk(child, f"{path}/")

    walk(model, "")
    return paths


def refusal(found: list[str], micro_batches: int, elsewhere: bool = False) -> StrategyConfigError:
    """The error for BatchNormalization layers ``found`` in this stage (or, ``elsewhere``, in
    another stage: every process must refuse, not only the one that holds them)."""
    where = "another stage of the model" if elsewhere else ", ".join(repr(p) for p in found)
    return StrategyConfigError(format_error(
        f"BatchNormalization in {where}: with micro_batches={micro_batches} its batch "
        "statistics would be computed per micro-batch, so training would differ from one "
        "device on the whole batch.",
        received=f"BatchNormalization ({where}), micro_batches={micro_batches}",
        expected="no BatchNormalization when micro_batches > 1, or the explicit opt-in",
        fix=BATCH_NORM_FIX))


def check_stage(model: Any, micro_batches: int, policy: str, group: ProcessGroup,
                timeout: float = 0.0) -> None:
    """Raises on every stage of ``group`` (the stages of this replica) if any holds a
    BatchNormalization while ``micro_batches > 1`` and ``policy`` is ``"refuse"``.

    A collective when ``group`` has more than one member (every stage calls it, eagerly, when
    its model is built): the stages' counts are summed, so a stage without one refuses too
    rather than wait for the others at its first step.
    """
    if micro_batches == 1 or policy != "refuse":
        return
    found = find(model)
    total = float(len(found))
    if group.size > 1:
        total = float(collective_ops.all_reduce_v2(
            tf.constant(total), group_size=group.size, group_key=group.key,
            instance_key=COUNT_KEY, merge_op="Add", final_op="Id", timeout=timeout))
    if found or total:
        raise refusal(found, micro_batches, elsewhere=not found)
