"""Distribution strategies that train one script on any topology.

Every strategy is a real `tf.distribute.Strategy` subclass plus `TfdistStrategyMixin`, created by
name with `get_strategy` (``"auto"`` reads the environment; see `tfdist.core.detect`).
Strategy classes are imported on first access, so ``import tfdist.strategies`` stays cheap.

Example:
    >>> import tfdist.strategies
    >>> strategy = tfdist.strategies.get_strategy("default")
    >>> with strategy.scope():
    ...     pass
"""

from __future__ import annotations

from typing import Any

from tfdist.core.detect import Detection, detect_strategy
from tfdist.core.registry import (
    available_strategies,
    get_strategy,
    get_strategy_class,
    register,
    strategy_traits,
)
from tfdist.core.traits import StrategyTraits

__all__ = [
    "available_strategies",
    "get_strategy",
    "get_strategy_class",
    "register",
    "strategy_traits",
    "StrategyTraits",
    "detect_strategy",
    "Detection",
    "TfdistStrategyMixin",
    "DefaultStrategy",
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "ParameterServerStrategy",
    "PipelineStrategy",
    "TensorStrategy",
    "ZeroStrategy",
]

_LAZY = {
    "TfdistStrategyMixin": "tfdist.strategies.base",
    "DefaultStrategy": "tfdist.strategies.default",
    "MirroredStrategy": "tfdist.strategies.mirrored",
    "MultiWorkerMirroredStrategy": "tfdist.strategies.multi_worker",
    "ParameterServerStrategy": "tfdist.strategies.parameter_server",
    "PipelineStrategy": "tfdist.strategies.pipeline",
    "TensorStrategy": "tfdist.strategies.tensor",
    "ZeroStrategy": "tfdist.strategies.zero",
    # Not in __all__: a star-import must not need Horovod.
    "HorovodStrategy": "tfdist.strategies.horovod",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tfdist.strategies' has no attribute {name!r}")
