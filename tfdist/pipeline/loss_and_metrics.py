"""What ``compile``'s loss and metrics become on a pipeline stage: the loss as one mean over the
batch (sample-weighted as Keras weighs it, summable over micro-batches), the regularization
losses apart from those a call adds, and metric objects named as ``compile`` names them.

The stage model (`tfdist.pipeline.keras_model`) and `PipelineStrategy.train_step` use them; the
last stage computes the loss and updates the metrics, every stage reads what they share.

Example:
    >>> import tensorflow as tf
    >>> from tfdist.core.flavour import get_keras
    >>> keras = get_keras()
    >>> loss = mean_loss(keras.losses.get("mse"))
    >>> float(loss(tf.zeros((2, 1)), tf.ones((2, 1)), sample_weight=tf.constant([1.0, 0.0])))
    0.5
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdist.compat import models as keras_compat
from tfdist.errors import StrategyConfigError, format_error
from tfdist.pipeline.engine import LossTerms

__all__ = ["resolve_metric", "resolve_metrics", "mean_loss", "loss_terms"]

_ACCURACY_BY_LOSS = {
    "sparse_categorical_crossentropy": "SparseCategoricalAccuracy",
    "categorical_crossentropy": "CategoricalAccuracy",
    "binary_crossentropy": "BinaryAccuracy",
}


def _loss_name(loss: Any) -> str:
    name = loss if isinstance(loss, str) else getattr(loss, "name", None) or getattr(
        loss, "__name__", "")
    return str(name)


def resolve_metric(keras: Any, metric: Any, loss: Any, prefix: str = "") -> Any:
    """A metric object for ``metric`` as ``compile`` would pick it (``"accuracy"`` by the loss);
    a metric named by a string gets ``prefix`` before its name (compile's ``weighted_``).

    Example:
        >>> from tfdist.core.flavour import get_keras
        >>> keras = get_keras()
        >>> type(resolve_metric(keras, "accuracy", "sparse_categorical_crossentropy")).__name__
        'SparseCategoricalAccuracy'
    """
    name = f"{prefix}{metric}"
    if isinstance(metric, str) and metric in ("accuracy", "acc"):
        cls = _ACCURACY_BY_LOSS.get(_loss_name(loss), "Accuracy")
        return getattr(keras.metrics, cls)(name=name)
    if isinstance(metric, str):  # named as given, as compile names it ("mae", not its class)
        resolved = keras.metrics.get(metric)
        if isinstance(resolved, type):
            return resolved(name=name)
        if not hasattr(resolved, "update_state"):
            return keras.metrics.MeanMetricWrapper(resolved, name=name)
        return type(resolved).from_config({**resolved.get_config(), "name": name})
    return metric


def _same_rank(weight: Any, values: Any) -> Any:
    """Sample weights shaped like the per-sample losses, as Keras squeezes or expands them."""
    if weight.shape.rank == values.shape.rank + 1 and weight.shape[-1] == 1:
        return tf.squeeze(weight, -1)
    if weight.shape.rank == values.shape.rank - 1:
        return tf.expand_dims(weight, -1)
    return weight


def mean_loss(loss_fn: Any) -> Any:
    """``loss_fn`` reduced to one mean over the batch (what ``compile``'s loss reports).

    The result takes optional sample weights: ``sum(loss_i * w_i) / rows``, as both Kerases'
    default reduction. A sum over rows divided by the row count: the micro-batches' losses,
    each over its rows and divided by M, add up to the batch's. A Loss object is called through
    its unreduced ``call``: tf-keras refuses its own default reduction inside a distribution
    strategy (the pipeline's ``fit`` runs in one).
    """
    per_sample = loss_fn.call if hasattr(loss_fn, "reduction") and hasattr(loss_fn, "call") \
        else loss_fn

    def reduced(y: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        # tfdist's code is not AutoGraph's (`tfdist.strategies.autograph`); a user's loss
        # function is converted where AutoGraph is on, as if the step had called it itself.
        autograph = tf.__internal__.autograph
        values = autograph.tf_convert(per_sample, autograph.control_status_ctx())(y, y_pred)
        if sample_weight is None:
            return tf.reduce_mean(values)
        values = values * _same_rank(tf.cast(sample_weight, values.dtype), values)
        return tf.reduce_sum(values) / tf.cast(tf.size(values), values.dtype)

    return reduced


def _sum(losses: list[Any]) -> Any | None:
    return tf.add_n([tf.cast(loss, tf.float32) for loss in losses]) if losses else None


def loss_terms(model: Any) -> LossTerms:
    """The engine's view of ``model.losses``: weight regularizers apart from the losses a call
    adds (activity regularizers, ``add_loss`` in ``call``), in either Keras.

    Example:
        >>> from tfdist.core.flavour import get_keras
        >>> keras = get_keras()
        >>> stage = keras.Sequential([keras.Input((2,)), keras.layers.Dense(
        ...     1, kernel_initializer="ones", kernel_regularizer=keras.regularizers.L1(0.5))])
        >>> float(loss_terms(stage).weights()), loss_terms(stage).added()
        (1.0, None)
    """
    return LossTerms(weights=lambda: _sum(keras_compat.weight_losses(model)),
                     added=lambda: _sum(keras_compat.call_losses(model)))


def resolve_metrics(keras: Any, metrics: Any, weighted_metrics: Any,
                    loss: Any) -> list[tuple[Any, bool]]:
    """``(metric object, weighted)`` for ``metrics`` then ``weighted_metrics``, named as
    ``compile`` names them (a weighted metric whose name is taken gets ``weighted_``).

    Example:
        >>> from tfdist.core.flavour import get_keras
        >>> keras = get_keras()
        >>> [(m.name, weighted) for m, weighted in resolve_metrics(keras, ["mae"], ["mae"], "mse")]
        [('mae', False), ('weighted_mae', True)]
    """
    for given, arg in ((metrics, "metrics"), (weighted_metrics, "weighted_metrics")):
        if isinstance(given, dict):
            raise StrategyConfigError(format_error(
                "Per-output metrics do not apply: a pipeline model has one output.",
                received=f"{arg}={given!r}", expected="a list of metrics",
                fix=f"pass {arg}=[...]"))
    real = [(resolve_metric(keras, m, loss), False) for m in metrics or []]
    taken = {m.name for m, _ in real}
    for metric in weighted_metrics or []:
        prefix = "weighted_" if isinstance(metric, str) and metric in taken else ""
        real.append((resolve_metric(keras, metric, loss, prefix), True))
    names = [m.name for m, _ in real]
    if len(set(names)) != len(names) or "loss" in names:
        raise StrategyConfigError(format_error(
            "Metric names must be distinct and not 'loss'.", received=f"{names}",
            expected="distinct names", fix="give the metrics distinct name= arguments"))
    return real
