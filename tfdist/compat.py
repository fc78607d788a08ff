"""Every Keras-version shim in one place: which Keras is in use, and what it can train with.

TensorFlow 2.21 ships Keras 3 as ``keras``; ``tf_keras`` is Keras 2 ("legacy Keras"), which
``tf.keras`` resolves to when ``TF_USE_LEGACY_KERAS=1`` is set before TensorFlow is imported.
Which flavours a strategy's ``model.fit`` trains with is one of its traits (``traits.keras``);
`check_supported` turns an unsupported pair into a clear error at strategy creation instead of
Keras's ``PerReplica`` failure deep inside ``fit``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any, Literal

from tfdist.errors import KerasCompatibilityError, format_error
from tfdist.strategies.traits import LEGACY_KERAS_ENV, StrategyTraits

KerasFlavour = Literal["keras3", "tf_keras"]


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


def _traits(strategy: str | StrategyTraits) -> StrategyTraits:
    if isinstance(strategy, StrategyTraits):
        return strategy
    from tfdist.strategies.registry import strategy_traits

    return strategy_traits(strategy)


def needs_tf_keras(strategy: str | StrategyTraits) -> bool:
    """Whether ``model.fit`` under ``strategy`` needs tf-keras (its traits' ``keras``).

    Example:
        >>> needs_tf_keras("multi_worker"), needs_tf_keras("horovod")
        (True, False)
    """
    return _traits(strategy).needs_tf_keras


def check_supported(
    strategy: str, flavour: KerasFlavour | None = None, *, traits: StrategyTraits | None = None
) -> None:
    """Raises if ``model.fit`` cannot train with ``strategy`` under this Keras.

    Args:
        strategy: The strategy's name (for the message; its traits come from the registry).
        flavour: The Keras in use (default: this process's).
        traits: The strategy's traits, when the caller has them (a strategy class).

    Raises:
        KerasCompatibilityError: The pair is known not to work; the message names the fix.

    Example:
        >>> check_supported("mirrored", "keras3")
        >>> check_supported("parameter_server", "keras3")
        Traceback (most recent call last):
        ...
        tfdist.errors.KerasCompatibilityError: ...
    """
    flavour = flavour or keras_flavour()
    supported = _traits(traits or strategy)
    if flavour in supported.keras:
        return
    if flavour == "keras3":
        raise KerasCompatibilityError(
            format_error(
                f"Strategy {strategy!r} cannot train with Keras 3: {supported.keras_unsupported}.",
                received=f"strategy={strategy!r} with Keras 3 (TF_USE_LEGACY_KERAS unset)",
                expected="tf-keras for this strategy",
                fix="set TF_USE_LEGACY_KERAS=1 before TensorFlow is imported (tfdist-launch does "
                "this for you) and build the model with `import tf_keras as keras` "
                "(or tfdist.compat.get_keras()); or use strategy='horovod', which works with "
                "Keras 3",
            )
        )
    raise KerasCompatibilityError(
        format_error(
            f"Strategy {strategy!r} cannot train with tf-keras: {supported.keras_unsupported}.",
            received=f"strategy={strategy!r} with tf-keras (TF_USE_LEGACY_KERAS=1)",
            expected="Keras 3 for this strategy",
            fix="unset TF_USE_LEGACY_KERAS and build the model with `import keras`",
        )
    )


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
            fix="build the model with tfdist.compat.get_keras(), or set/unset "
            "TF_USE_LEGACY_KERAS before importing TensorFlow",
        )
    )


def tf_variable(variable: Any) -> Any:
    """The ``tf.Variable`` behind a variable of either flavour (Keras 3 keeps it in ``.value``).

    Example:
        >>> import keras, tensorflow as tf
        >>> isinstance(tf_variable(keras.Variable(1.0)), tf.Variable)
        True
    """
    import tensorflow as tf

    if isinstance(variable, tf.Variable):
        return variable
    value = getattr(variable, "value", None)
    if isinstance(value, tf.Variable):
        return value
    raise TypeError(
        format_error(
            "Expected a variable.",
            received=type(variable).__name__,
            expected="a tf.Variable or a Keras 3 variable",
            fix="pass model.variables or optimizer.variables",
        )
    )


def optimizer_variables(optimizer: Any) -> list[Any]:
    """An optimizer's variables: a property in Keras 3 and tf-keras, a method on legacy optimizers.

    Example:
        >>> import keras
        >>> [v.name for v in optimizer_variables(keras.optimizers.SGD())]
        ['iteration', 'learning_rate']
    """
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


@contextlib.contextmanager
def abstract_build(flavour: KerasFlavour | None = None) -> Iterator[None]:
    """A context where building a Keras model allocates no variable memory.

    Layers get their shapes and configs, and outputs their symbolic shapes, but no weights: Keras
    3 defers initialisation (``StatelessScope(initialize_variables=False)``; the deferred
    variables are dropped afterwards), tf-keras builds in a throwaway ``tf.Graph``. The pipeline
    describes a whole model this way and then builds one stage for real.

    Example:
        >>> keras = get_keras()
        >>> with abstract_build():
        ...     model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> model.count_params()
        8
    """
    if (flavour or keras_flavour()) == "tf_keras":
        import tensorflow as tf

        with tf.Graph().as_default():
            yield
        return
    keras = get_keras("keras3")
    from keras.src.backend.common import global_state

    key = "uninitialized_variables"
    before = list(global_state.get_global_attribute(key, []) or [])
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield
    finally:
        global_state.set_global_attribute(key, before)


def track_loss(model: Any, loss: Any, batch: Any) -> Any:
    """Adds one batch's mean ``loss`` to ``model``'s running ``loss`` metric, as ``fit`` does.

    tf-keras's ``compute_loss`` updates the metric itself; Keras 3's ``train_step`` does it
    after ``compute_loss``. A custom ``train_step`` calling ``compute_loss`` uses this once per
    call so the ``loss`` ``fit`` shows is the same in both.
    """
    tracker = getattr(model, "_loss_tracker", None)
    if flavour_of(model) == "keras3" and tracker is not None:
        tracker.update_state(loss, sample_weight=batch)
    return loss
