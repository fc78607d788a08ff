"""Which strategy ``get_strategy("auto")`` picks, as a pure function of the environment.

Rules, first match wins:

1. ``TF_CONFIG`` and a Horovod/MPI rank variable at once -> `StrategyConfigError` (two launchers
   disagree on who this process is).
2. ``TF_CONFIG`` whose task is the ``evaluator`` -> ``default`` (it evaluates checkpoints alone).
2b. ``TFDIST_STRATEGY`` (set by ``tfdist-launch --strategy``) other than ``auto`` -> that name.
3. ``TF_CONFIG`` with a ``ps`` role -> ``parameter_server``.
4. ``TF_CONFIG`` with more than one of chief + workers -> ``multi_worker``.
5. A rank variable (`RANK_VARIABLES`: set by ``horovodrun`` or ``mpirun``) -> ``horovod``.
6. More than one local GPU -> ``mirrored``.
7. Otherwise -> ``default``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

from tfdist.core.environ import peek_tf_config
from tfdist.core.traits import STRATEGY_ENV
from tfdist.errors import StrategyConfigError, format_error

__all__ = [
    "Detection",
    "RANK_VARIABLES",
    "detect",
    "detect_strategy",
    "launch_strategy",
    "local_gpu_count",
]

RANK_VARIABLES: tuple[str, ...] = (
    "HOROVOD_RANK",  # horovodrun (Gloo)
    "OMPI_COMM_WORLD_RANK",  # Open MPI's mpirun
    "PMI_RANK",  # MPICH, Intel MPI
    "PMIX_RANK",  # PMIx launchers (Open MPI 5, srun --mpi=pmix)
)
"""Environment variables whose presence means a Horovod/MPI launcher started this process."""


LAUNCHER_STRATEGY_ENV = STRATEGY_ENV
"""Set by ``tfdist-launch`` to the strategy it launched for, so ``auto`` agrees with it."""


class Detection(NamedTuple):
    """A strategy name and the reason it was chosen."""

    name: str
    reason: str


def detect(environ: Mapping[str, str], num_gpus: int) -> Detection:
    """Applies the module's rules to an environment mapping and a local GPU count.

    Example:
        >>> detect({"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:1"]}, '
        ...         '"task": {"type": "worker", "index": 0}}'}, num_gpus=0).name
        'multi_worker'
        >>> detect({}, num_gpus=2)
        Detection(name='mirrored', reason='2 local GPUs and no cluster')
    """
    view = peek_tf_config(environ)
    ranks = [var for var in RANK_VARIABLES if var in environ]
    if view and ranks:
        found = ", ".join(f"{var}={environ[var]}" for var in ranks)
        raise StrategyConfigError(
            format_error("This process has both a TF_CONFIG and a Horovod/MPI rank.",
                         received=f"TF_CONFIG set and {found}",
                         expected="either TF_CONFIG (TensorFlow strategies) or a rank (horovod)",
                         fix="unset TF_CONFIG when launching with horovodrun/mpirun, or launch "
                         "without them to use TF_CONFIG"))
    if view:
        trainers = view.count("chief") + view.count("worker")
        if view.task_type == "evaluator":
            return Detection("default", "TF_CONFIG task is the evaluator, which runs alone")
    launched = environ.get(LAUNCHER_STRATEGY_ENV, "").strip()
    if launched and launched != "auto":
        return Detection(launched, f"{LAUNCHER_STRATEGY_ENV}={launched} (set by tfdist-launch)")
    if view:
        if view.count("ps"):
            return Detection("parameter_server", f"TF_CONFIG has {view.count('ps')} ps task(s)")
        if trainers > 1:
            return Detection("multi_worker", f"TF_CONFIG has {trainers} workers (chief included)")
    if ranks:
        return Detection("horovod", f"{ranks[0]}={environ[ranks[0]]} is set (Horovod/MPI launch)")
    if num_gpus > 1:
        return Detection("mirrored", f"{num_gpus} local GPUs and no cluster")
    where = "1 worker in TF_CONFIG" if view else "no TF_CONFIG, no Horovod rank"
    return Detection("default", f"{where}, {num_gpus} local GPU(s)")


def local_gpu_count() -> int:
    """How many GPUs TensorFlow sees on this host (imports TensorFlow).

    Example:
        >>> local_gpu_count() >= 0
        True
    """
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def detect_strategy(
    environ: Mapping[str, str] | None = None, num_gpus: int | None = None
) -> Detection:
    """`detect` with defaults: ``os.environ`` and the GPUs TensorFlow sees.

    Example:
        >>> detect_strategy({"HOROVOD_RANK": "1"}, num_gpus=0).name
        'horovod'
    """
    env = os.environ if environ is None else environ
    return detect(env, local_gpu_count() if num_gpus is None else num_gpus)


def launch_strategy(*, workers: int, ps: int, ranks: bool = False,
                    stages: int | None = None, tensor: int | None = None) -> str:
    """What ``auto`` means for a job about to be launched with these counts.

    ``ps`` tasks -> ``parameter_server``; pipeline stages asked for -> ``pipeline``; tensor
    shards alone -> ``tensor``; ranks asked for (an MPIJob export) -> ``horovod``; more than one
    worker -> ``multi_worker``; else ``default``. The tasks then detect the same name from
    `LAUNCHER_STRATEGY_ENV`.

    Example:
        >>> launch_strategy(workers=2, ps=1), launch_strategy(workers=1, ps=0)
        ('parameter_server', 'default')
        >>> launch_strategy(workers=4, ps=0, stages=2), launch_strategy(workers=2, ps=0, tensor=2)
        ('pipeline', 'tensor')
    """
    if stages is not None:
        return "pipeline"
    if tensor is not None:
        return "tensor"
    if ps > 0:
        return "parameter_server"
    if ranks:
        return "horovod"
    return "multi_worker" if workers > 1 else "default"
