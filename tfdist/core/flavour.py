"""Which Keras this process trains with, found without importing TensorFlow.

TensorFlow 2.21 ships Keras 3 as ``keras``; ``tf_keras`` is Keras 2 ("legacy Keras"), which
``tf.keras`` resolves to when ``TF_USE_LEGACY_KERAS=1`` is set before TensorFlow is imported.
Every layer asks this module which one is in use (`keras_flavour`), which module to build models
with (`get_keras`) and which one an object comes from (`flavour_of`).

Example:
    >>> from tfdist.core.flavour import get_keras
    >>> keras = get_keras()
    >>> model = keras.Sequential([keras.layers.Dense(1)])
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Literal

from tfdist.errors import KerasCompatibilityError, format_error

__all__ = [
    "KerasFlavour",
    "LEGACY_KERAS_ENV",
    "check_model",
    "flavour_of",
    "get_keras",
    "keras_flavour",
    "legacy_keras_requested",
]

KerasFlavour = Literal["keras3", "tf_keras"]
"""``"keras3"`` (``import keras``) or ``"tf_keras"`` (``import tf_keras``, Keras 2)."""

LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"
"""Makes ``tf.keras`` resolve to tf-keras when set to 1 before TensorFlow is imported."""


def legacy_keras_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``TF_USE_LEGACY_KERAS`` asks ``tf.keras`` to be tf-keras.

    Example:
        >>> legacy_keras_requested({"TF_USE_LEGACY_KERAS": "1"})
        True
    """
    env = os.environ if environ is None else environ
    return env.get(LEGACY_KERAS_ENV, "").strip().lower() in ("1", "true", "yes")


def keras_flavour(environ: Mapping[str, str] | None = None) -> KerasFlavour:
    """The Keras that ``tf.keras`` resolves to in this process: ``"tf_keras"`` or ``"keras3"``.

    Example:
        >>> keras_flavour({})
        'keras3'
    """
    return "tf_keras" if legacy_keras_requested(environ) else "keras3"


def get_keras(flavour: KerasFlavour | None = None) -> ModuleType:
    """The Keras module to build models with: ``tf_keras`` or ``keras``.

    Example:
        >>> keras = get_keras()
        >>> model = keras.Sequential([keras.layers.Dense(1)])
    """
    flavour = flavour or keras_flavour()
    if flavour == "tf_keras":
        try:
            return importlib.import_module("tf_keras")
        except ImportError as err:
            raise KerasCompatibilityError(
                "tf-keras is not installed. Fix: pip install tf-keras==2.21.0."
            ) from err
    return importlib.import_module("keras")


def flavour_of(obj: Any) -> KerasFlavour | None:
    """The Keras a model, optimizer or layer comes from, by its class's module; None if neither.

    Example:
        >>> import keras
        >>> flavour_of(keras.layers.Dense(1))
        'keras3'
    """
    for cls in type(obj).__mro__:
        root = cls.__module__.split(".", 1)[0]
        if root == "tf_keras":
            return "tf_keras"
        if root == "keras":
            return "keras3"
    return None


def check_model(model: Any, flavour: KerasFlavour | None = None) -> None:
    """Raises if ``model`` comes from another Keras than the one ``tf.keras``/strategies use.

    Mixing them (a Keras 3 model under ``TF_USE_LEGACY_KERAS=1``) fails deep in ``fit``.
    """
    flavour = flavour or keras_flavour()
    found = flavour_of(model)
    if found is None or found == flavour:
        return
    names = {"keras3": "Keras 3 (`import keras`)", "tf_keras": "tf-keras (`import tf_keras`)"}
    raise KerasCompatibilityError(
        format_error(
            "The model was built with a different Keras than this process trains with.",
            received=f"a {names[found]} model",
            expected=f"a {names[flavour]} model (TF_USE_LEGACY_KERAS="
            f"{os.environ.get(LEGACY_KERAS_ENV, '')!r})",
            fix="build the model with tfdist.core.flavour.get_keras(), or set/unset "
            "TF_USE_LEGACY_KERAS before importing TensorFlow",
        )
    )
