"""The cost-model advisor: which strategy, how many ps, where to split, and why.

`advise(model, cluster, batch=...)` measures the model on this machine (per-layer forward and
backward, the whole step), takes the network's alpha-beta-gamma constants (from a cached or
fresh 2-process probe, or a file), predicts each layout's step time, samples/s and memory, and
ranks them. ``tfdist-advise`` is its command line. The package itself is callable, so
``tfdist.advise(model, cluster, batch=64)`` is ``tfdist.advise.advise(...)``.

Example:
    >>> from tfdist.advise import model
    >>> round(model.bubble(4, 4), 3)
    0.429
"""

from __future__ import annotations

import sys
import types
from typing import Any

from tfdist.advise.advisor import Advice, advise, get_constants
from tfdist.advise.candidates import Candidate, Cluster, as_cluster, candidates
from tfdist.advise.model import Link
from tfdist.advise.network import Constants
from tfdist.advise.predict import Prediction, Term, predict
from tfdist.advise.profile import ModelProfile, profile_model

__all__ = ["Advice", "Candidate", "Cluster", "Constants", "Link", "ModelProfile", "Prediction",
           "Term", "advise", "as_cluster", "candidates", "get_constants", "predict",
           "profile_model"]


class _CallableModule(types.ModuleType):
    """Lets ``tfdist.advise(...)`` call `advise`: the package and the function share a name."""

    def __call__(self, *args: Any, **kwargs: Any) -> Advice:
        return advise(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
