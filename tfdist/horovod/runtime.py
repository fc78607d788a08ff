"""Horovod's process-level state: the lazy import, ``init`` with its tuning knobs, rank and size.

Horovod is optional. Nothing here imports it until a function is called; when it is missing the
call raises `MissingDependencyError` saying how to build it (``make horovod``: Horovod
0.28.1 does not build from PyPI against TensorFlow 2.21).

Tuning knobs are read by Horovod's background thread once, in ``hvd.init()``:

* ``HOROVOD_FUSION_THRESHOLD`` (bytes, default 64 MiB): tensors queued within one cycle are
  packed into one buffer up to this size and reduced in one collective (tensor fusion).
* ``HOROVOD_CYCLE_TIME`` (milliseconds, default 1): how long the background thread waits to
  collect tensors before each fusion round.

`init` sets them from its arguments before calling ``hvd.init()``; once Horovod is initialised
they can no longer change, and asking for a different value raises.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from tfdist.errors import MissingDependencyError, StrategyConfigError, format_error
from tfdist.horovod import checks
from tfdist.options import check_positive_int, check_positive_number

__all__ = [
    "FUSION_THRESHOLD_ENV",
    "CYCLE_TIME_ENV",
    "hvd",
    "keras_api",
    "is_available",
    "init",
    "rank",
    "size",
    "local_rank",
]

FUSION_THRESHOLD_ENV = "HOROVOD_FUSION_THRESHOLD"
CYCLE_TIME_ENV = "HOROVOD_CYCLE_TIME"



def hvd() -> ModuleType:
    """The ``horovod.tensorflow`` module, imported on first use.

    Raises:
        MissingDependencyError: Horovod (with TensorFlow support) is not importable.

    Example:
        >>> hvd().__name__
        'horovod.tensorflow'
    """
    try:
        return importlib.import_module("horovod.tensorflow")
    except ImportError as err:
        raise MissingDependencyError(
            format_error(
                f"Horovod is not available ({err}).",
                received="no importable horovod.tensorflow",
                expected="Horovod 0.28.1 built with TensorFlow and Gloo (or MPI)",
                fix=checks.INSTALL_FIX,
            )
        ) from err


def keras_api() -> ModuleType:
    """``horovod.tensorflow.keras`` (the implementation behind `tfdist.horovod`'s Keras pieces).

    Raises:
        MissingDependencyError: Horovod (with TensorFlow support) is not importable.

    Example:
        >>> keras_api().DistributedOptimizer.__module__
        'horovod.tensorflow.keras'
    """
    hvd()
    return importlib.import_module("horovod.tensorflow.keras")


def is_available() -> bool:
    """Whether ``horovod.tensorflow`` can be imported (imports it).

    Example:
        >>> is_available()
        True
    """
    try:
        hvd()
    except MissingDependencyError:
        return False
    return True


def _knobs(fusion_threshold_bytes: int | None, cycle_time_ms: float | None) -> dict[str, str]:
    knobs = {}
    if check_positive_int("fusion_threshold_bytes", fusion_threshold_bytes) is not None:
        knobs[FUSION_THRESHOLD_ENV] = str(fusion_threshold_bytes)
    if check_positive_number("cycle_time_ms", cycle_time_ms) is not None:
        knobs[CYCLE_TIME_ENV] = f"{float(cycle_time_ms):g}"
    return knobs


def init(
    fusion_threshold_bytes: int | None = None, cycle_time_ms: float | None = None
) -> ModuleType:
    """Initialises Horovod once (idempotent) and returns ``horovod.tensorflow``.

    Args:
        fusion_threshold_bytes: Sets ``HOROVOD_FUSION_THRESHOLD`` before ``hvd.init()``. None
            keeps the environment's value (Horovod's default: 64 MiB).
        cycle_time_ms: Sets ``HOROVOD_CYCLE_TIME`` before ``hvd.init()``. None keeps the
            environment's value (default 1 ms).

    Raises:
        StrategyConfigError: Horovod is already initialised with a different value, or it has
            one process while the environment says the job has several (`checks.ranks_problem`:
            a Horovod script started by the wrong launcher).
        MissingDependencyError: Horovod is not installed.

    Example:
        >>> init().size() >= 1
        True
    """
    knobs = _knobs(fusion_threshold_bytes, cycle_time_ms)
    module = hvd()
    if module.is_initialized():
        _check_unchanged(knobs)
    else:
        os.environ.update(knobs)
        module.init()
    problem = checks.ranks_problem(module.size(), os.environ)
    if problem:
        raise StrategyConfigError(problem)
    return module


def _check_unchanged(knobs: dict[str, str]) -> None:
    for name, wanted in knobs.items():
        current = os.environ.get(name)
        if current != wanted:
            raise StrategyConfigError(
                format_error(
                    f"Horovod is already initialised, so {name} can no longer change.",
                    received=f"{name}={wanted} requested, {current!r} in effect",
                    expected="the same value as when hvd.init() ran",
                    fix=f"set {name}={wanted} in the environment of horovodrun, or create the "
                    "tfdist Horovod objects before anything else calls hvd.init()",
                )
            )


def rank() -> int:
    """This process's rank among all Horovod processes (initialises Horovod if needed).

    Example:
        >>> rank()  # one process
        0
    """
    return int(init().rank())


def size() -> int:
    """How many Horovod processes take part (initialises Horovod if needed).

    Example:
        >>> size()  # one process
        1
    """
    return int(init().size())


def local_rank() -> int:
    """This process's rank among the Horovod processes of its host.

    Example:
        >>> local_rank()  # one process
        0
    """
    return int(init().local_rank())
