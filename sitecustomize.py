"""Test-suite start-up knob: Keras 3 starts without scikit-learn in the processes the tests start.

Python imports this module at start-up in every process whose path holds this checkout (the
tests start their children with ``PYTHONPATH=<checkout>``). It does nothing unless
``TFDIST_TEST_LEAN_KERAS=1`` (``tests/conftest.py`` sets it for the processes the suite starts).

Why: ``import tensorflow`` imports Keras 3, whose ``keras.wrappers`` (the scikit-learn estimator
wrappers) imports scikit-learn, and with it SciPy, whenever they are installed (the ``test`` extra
installs them): about 1 of the 4.4 CPU-seconds of the import, paid by every task process of every
multi-process test. With the knob set, scikit-learn is hidden from ``keras.src.wrappers`` only:
Keras then defines its wrappers as it does without scikit-learn (unusable, and no test uses them),
and any other ``import sklearn`` (the examples load data and score with it) works as usual.
"""

from __future__ import annotations

import os
import sys

LEAN_KERAS_ENV = "TFDIST_TEST_LEAN_KERAS"
_HIDDEN_FROM = "keras.src.wrappers"


class _HideSklearnFromKerasWrappers:
    """A `sys.meta_path` finder: ``import sklearn`` from ``keras.src.wrappers`` is not found."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "sklearn" and _imported_from_keras_wrappers():
            raise ModuleNotFoundError(f"{LEAN_KERAS_ENV}=1 hides sklearn from Keras's wrappers",
                                      name=name)
        return None  # every other import: the next finder decides


def _imported_from_keras_wrappers(depth: int = 40) -> bool:
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return False
        if frame.f_globals.get("__name__", "").startswith(_HIDDEN_FROM):
            return True
        frame = frame.f_back
    return False


if os.environ.get(LEAN_KERAS_ENV) == "1" and "sklearn" not in sys.modules:
    sys.meta_path.insert(0, _HideSklearnFromKerasWrappers())
