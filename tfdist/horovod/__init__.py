"""Horovod for TensorFlow 2.21 with Keras 3 or tf-keras, without a strategy.

One implementation: Horovod's own ``horovod.tensorflow.keras``, which tfdist's build patches for
TensorFlow 2.21 and both Keras flavours (``launch/horovod-patches``). This package binds it thinly:

* `DistributedOptimizer`: Horovod's Keras ``DistributedOptimizer`` (gradients averaged over all
  ranks before each update), with tfdist's option names and checks.
* `BroadcastVariablesCallback`: Horovod's broadcast callback logic (rank 0's variables to every
  rank when ``fit`` starts and after its first batch), bound to the Keras flavour asked for.
* `MetricAverageCallback`: Horovod's metric averaging (epoch-end logs averaged over ranks).

plus `init` (with the tensor-fusion knobs), `rank`, `size`, `local_rank` and `is_available`. For
the ``tf.distribute`` way (``strategy.scope()``), see `tfdist.strategies.horovod.HorovodStrategy`.

Importing this package does not import Horovod; the first call that needs it does, and raises
`tfdist.MissingDependencyError` with the fix (``bash launch/setup.sh``) when it is not built.

Example:
    A script started with ``horovodrun -np 2 --gloo python train.py``, each rank on its own
    half of the data::

        import keras, tfdist.horovod as thvd
        thvd.init()
        model.compile(optimizer=thvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
        model.fit(x_of_this_rank, y_of_this_rank, batch_size=32,
                  callbacks=[thvd.BroadcastVariablesCallback(), thvd.MetricAverageCallback()])
"""

from __future__ import annotations

import importlib
from typing import Any

from tfdist.horovod.runtime import init, is_available, local_rank, rank, size

__all__ = [
    "init",
    "is_available",
    "rank",
    "size",
    "local_rank",
    "DistributedOptimizer",
    "BroadcastVariablesCallback",
    "MetricAverageCallback",
]

_LAZY = {
    "DistributedOptimizer": "tfdist.horovod.optimizer",
    "BroadcastVariablesCallback": "tfdist.horovod.callbacks",
    "MetricAverageCallback": "tfdist.horovod.callbacks",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tfdist.horovod' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
