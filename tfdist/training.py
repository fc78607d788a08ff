"""`fit`: ``model.fit`` under every tfdist strategy and both Kerases, one entry point.

Everywhere ``model.fit`` works, `fit` is ``model.fit``. The one place Keras's own does not is
Keras 3 under ParameterServerStrategy (keras#18624; the shim ``parameter_server_fit`` in
`tfdist.compat.KERAS3_SHIMS` says for which Keras versions). There `fit` runs tfdist's
coordinator-driven loop (`tfdist.coordinator_fit`), the one that shim also routes ``model.fit``
and ``model.evaluate`` to, so the same call works whether or not the shims are installed.

Example:
    The same script trains with either Keras, under any strategy::

        strategy = tfdist.get_strategy("auto")
        with strategy.scope():
            model = build_model()
            model.compile(...)
        history = tfdist.fit(model, strategy.distribute_dataset(dataset_fn), epochs=3,
                             steps_per_epoch=100)
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdist import compat
from tfdist.coordinator_fit import PerWorkerInput, coordinator_fit
from tfdist.core import flavour
from tfdist.errors import StrategyConfigError, format_error

__all__ = ["fit", "PerWorkerInput", "optimizer_variables", "tf_variable", "track_loss"]


def fit(model: Any, x: Any = None, y: Any = None, **kwargs: Any) -> Any:
    """``model.fit(x, y, **kwargs)``, also where Keras's own ``fit`` cannot train.

    Args:
        model: A compiled Keras model (either flavour), built in the strategy's scope.
        x: The input, as ``model.fit`` takes it; under ParameterServer, what
            ``strategy.distribute_dataset(dataset_fn)`` returns.
        y: Targets, as ``model.fit`` takes them (None for datasets).
        **kwargs: ``model.fit``'s other arguments. Under ParameterServer with Keras 3:
            those of `tfdist.coordinator_fit.FIT_ARGS` (``steps_per_epoch`` required,
            ``validation_data`` with ``validation_steps``).

    Returns:
        The ``History`` of the run (``history.history["loss"]``: one value per epoch).

    Raises:
        StrategyConfigError: Under ParameterServer with Keras 3, an argument the coordinator
            cannot honour (named in the message), input it cannot feed, or
            ``steps_per_epoch`` missing.

    Example:
        >>> import numpy as np
        >>> keras = flavour.get_keras()
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile(optimizer="sgd", loss="mse")
        >>> history = fit(model, np.ones((8, 2)), np.ones((8, 1)), epochs=2, verbose=0)
        >>> len(history.history["loss"])
        2
    """
    strategy = model.distribute_strategy
    if not compat.fit_needs_coordinator(strategy, model):
        if isinstance(x, (tf.data.Dataset, tf.distribute.DistributedDataset)):
            kwargs.setdefault("shuffle", False)  # fit ignores it for datasets; Keras 3 warns
        return _model_fit(model, x, y, kwargs)
    return coordinator_fit(model, x, y, **kwargs)


_WRONG_SCOPE = "Mixing different tf.distribute.Strategy objects"


def _model_fit(model: Any, x: Any, y: Any, kwargs: dict[str, Any]) -> Any:
    """``model.fit``, with Keras 3's error for an optimizer made outside the model's strategy
    scope (raised while building, before the first step) turned into one that names the fix."""
    try:
        return model.fit(x, y, **kwargs)
    except RuntimeError as err:
        made_under = getattr(model.optimizer, "_distribution_strategy", None)
        if _WRONG_SCOPE not in str(err) or made_under is model.distribute_strategy:
            raise
        raise StrategyConfigError(format_error(
            "The model's optimizer was made outside the strategy's scope: Keras 3 creates the "
            "optimizer's slots (Adam's moments, SGD's momentum) under the strategy that was in "
            "scope when the optimizer was made, so fit stopped before its first step.",
            received=f"{type(model.optimizer).__name__} made under "
            f"{type(made_under).__name__}, the model under "
            f"{type(model.distribute_strategy).__name__}",
            expected="the optimizer made inside the model's strategy.scope()",
            fix="call model.compile(optimizer=...) inside the `with strategy.scope():` block "
            "that builds the model")) from err


# ------------------------------------------- variables and loss under either Keras
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


def track_loss(model: Any, loss: Any, batch: Any) -> Any:
    """Adds one batch's mean ``loss`` to ``model``'s running ``loss`` metric, as ``fit`` does.

    tf-keras's ``compute_loss`` updates the metric itself; Keras 3's ``train_step`` does it
    after ``compute_loss``. A custom ``train_step`` calling ``compute_loss`` uses this once per
    call so the ``loss`` ``fit`` shows is the same in both.
    """
    tracker = getattr(model, "_loss_tracker", None)
    if flavour.flavour_of(model) == "keras3" and tracker is not None:
        tracker.update_state(loss, sample_weight=batch)
    return loss
