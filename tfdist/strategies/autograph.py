"""tfdist's own code runs inside ``tf.function`` as written, not rewritten by AutoGraph.

AutoGraph converts every Python function a ``tf.function`` calls, recursively, unless its module
is in TensorFlow's list of libraries not to convert (``tensorflow``, ``keras``, ``tf_keras``,
``numpy``...). tfdist's step code (the pipeline's schedule, sends and receives, the tensor
layers' collectives) has no tensor-dependent Python control flow: it already runs unconverted
under Keras 3's ``fit`` (whose step functions are ``do_not_convert``). Converted, it cost the
first trace of a one-stage pipeline's custom-loop step 3.5 of its 3.7 CPU-s, and of every
tf-keras ``fit`` and custom-loop step of the pipeline and tensor strategies the same.

`exclude_tfdist` adds tfdist to that list, the way TensorFlow lists Keras: a user's layers that
tfdist calls are still converted wherever they would be without tfdist (tf-keras converts each
layer's ``call`` itself while AutoGraph is on; Keras 3 converts nothing).

Example:
    >>> exclude_tfdist()
    >>> from tensorflow.python.autograph.core import config
    >>> [str(rule) for rule in config.CONVERSION_RULES if "tfdist" in str(rule)]
    ['DoNotConvert rule for tfdist']
"""

from __future__ import annotations

__all__ = ["exclude_tfdist"]

_PACKAGE = "tfdist"


def exclude_tfdist() -> None:
    """Adds tfdist to AutoGraph's do-not-convert libraries (once per process)."""
    from tensorflow.python.autograph.core import config

    if any(str(rule) == f"DoNotConvert rule for {_PACKAGE}" for rule in config.CONVERSION_RULES):
        return
    config.CONVERSION_RULES = (config.DoNotConvert(_PACKAGE), *config.CONVERSION_RULES)
