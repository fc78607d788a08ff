"""tfdist: train one TensorFlow/Keras script on any distributed topology.

Words used throughout:

* **task**: one process of a job, named by its role and index (``worker:1``).
* **chief**: the task that coordinates: it writes checkpoints, logs and the final model, and in a
  parameter-server job it is the coordinator that runs the training program.
* **worker**: a task that computes gradients. In multi-worker and Horovod jobs every worker runs
  the training script; in a parameter-server job workers run a TF server and execute the steps
  the chief dispatches.
* **ps**: a parameter-server task that stores (shards of) the variables.
* **evaluator**: a sidecar task that evaluates the chief's checkpoints; never part of the
  training cluster.
* **replica**: one copy of the model computing on one slice of each global batch; a worker with
  two GPUs holds two replicas. ``num_replicas_in_sync`` counts them over the whole job.
* **mesh**: the training tasks (chief and workers) laid out as ``data x pipe x tensor``
  (D replicas of K pipeline stages, each split T ways); each task's coordinates and collective
  groups come from `tfdist.Mesh`.

Example:
    >>> import tfdist
    >>> spec = tfdist.ClusterSpec.from_hosts("h1:2,h2:2", ps=1, chief=True)
    >>> spec.tf_config("worker", 1)["task"]
    {'type': 'worker', 'index': 1}
"""

from __future__ import annotations

import importlib
from typing import Any

from tfdist import startup_hook as _startup_hook
from tfdist.cluster import ClusterSpec, Task, read_tf_config
from tfdist.errors import (
    AdviseError,
    ClusterConfigError,
    EvaluatorTimeoutError,
    KerasCompatibilityError,
    LaunchError,
    MissingDependencyError,
    StrategyConfigError,
    TaskFailedError,
    TaskTimeoutError,
    TfdistError,
)
from tfdist.logs import configure_from_env as _configure_logs
from tfdist.parallel.mesh import Mesh

__version__ = "0.1.0"

_configure_logs()  # a launched task prints tfdist's info lines (`tfdist.logs`)
# keras.distribution on TensorFlow (`tfdist.kdist`), once Keras is imported (now, if it is)
_startup_hook.arm(hooks=("tfdist.kdist:install",))

# Names that import TensorFlow (or Horovod) are loaded on first use, so `import tfdist` stays fast
# for cluster-spec work and the launcher.
_LAZY = {
    "get_strategy": "tfdist.strategies",
    "available_strategies": "tfdist.strategies",
    "register_strategy": "tfdist.strategies",
    "strategy_traits": "tfdist.strategies",
    "StrategyTraits": "tfdist.strategies",
    "detect_strategy": "tfdist.strategies",
    "DefaultStrategy": "tfdist.strategies",
    "MirroredStrategy": "tfdist.strategies",
    "MultiWorkerMirroredStrategy": "tfdist.strategies",
    "ParameterServerStrategy": "tfdist.strategies",
    "PipelineStrategy": "tfdist.strategies",
    "TensorStrategy": "tfdist.strategies",
    "ZeroStrategy": "tfdist.strategies",
    "HorovodStrategy": "tfdist.strategies.horovod",
    "DistributedOptimizer": "tfdist.horovod",
    "fit": "tfdist.training",
    "get_keras": "tfdist.core.flavour",
    "keras_flavour": "tfdist.core.flavour",
    "is_evaluator": "tfdist.evaluator",
    "run_sidecar_evaluator": "tfdist.evaluator",
}

__all__ = [
    "advise",
    "AdviseError",
    "ClusterSpec",
    "Task",
    "read_tf_config",
    "Mesh",
    "ClusterConfigError",
    "EvaluatorTimeoutError",
    "KerasCompatibilityError",
    "LaunchError",
    "MissingDependencyError",
    "StrategyConfigError",
    "TaskFailedError",
    "TaskTimeoutError",
    "TfdistError",
    *_LAZY,
]


_RENAMED = {"register_strategy": "register"}


def __getattr__(name: str) -> Any:
    if name == "advise":  # the package, callable: tfdist.advise(model, cluster, batch=...)
        return importlib.import_module("tfdist.advise")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), _RENAMED.get(name, name))
    raise AttributeError(f"module 'tfdist' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
