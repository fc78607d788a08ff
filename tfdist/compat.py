"""Every Keras-version shim in one place: which Keras is in use, and what it can train with.

TensorFlow 2.21 ships Keras 3 as ``keras``; ``tf_keras`` is Keras 2 ("legacy Keras"), which
``tf.keras`` resolves to when ``TF_USE_LEGACY_KERAS=1`` is set before TensorFlow is imported.
Which flavours a strategy's ``model.fit`` trains with is one of its traits (``traits.keras``);
`check_supported` turns an unsupported pair into a clear error at strategy creation instead of
Keras's ``PerReplica`` failure deep inside ``fit``.

Keras 3 shims (`KERAS3_SHIMS`): each names the upstream issue, the Keras versions it applies to,
the versions it was checked against, and a probe of Keras's own code that says whether the bug is
still there; a Keras release that fixes the bug (or a version outside the range) switches the
shim off by itself. `install_keras3_shims` applies those that are needed, once per process;
``TFDIST_KERAS_SHIMS=off`` turns them all off (to see Keras's own behaviour).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tfdist.core.flavour import KerasFlavour, flavour_of, get_keras, keras_flavour
from tfdist.core.traits import StrategyTraits
from tfdist.errors import KerasCompatibilityError, format_error


def _traits(strategy: str | StrategyTraits) -> StrategyTraits:
    if isinstance(strategy, StrategyTraits):
        return strategy
    from tfdist.core.registry import strategy_traits

    return strategy_traits(strategy)


def needs_tf_keras(strategy: str | StrategyTraits) -> bool:
    """Whether ``model.fit`` under ``strategy`` needs tf-keras (its traits' ``keras``).

    Example:
        >>> needs_tf_keras("multi_worker"), needs_tf_keras("parameter_server")
        (False, False)
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
        >>> check_supported("parameter_server", "keras3")
        >>> check_supported("mine", "keras3", traits=StrategyTraits(keras=("tf_keras",)))
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
                "(or tfdist.core.flavour.get_keras()); or use strategy='horovod', which works with "
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


def bind_unbuilt_optimizer(optimizer: Any, strategy: Any) -> bool:
    """Makes a Keras 3 optimizer not yet built create its slots under ``strategy``; returns
    whether it did.

    Keras 3's TensorFlow optimizer keeps the strategy in scope when it was constructed and creates
    its slots (Adam's moments, SGD's momentum) under that strategy: one constructed outside
    ``strategy.scope()`` fails in its first ``fit`` with "Mixing different tf.distribute.Strategy
    objects". Only for a strategy whose variables are plain per process (the pipeline): under a
    mirrored strategy the optimizer's own variables must be mirrored too, so there the optimizer
    has to be constructed inside the scope. tf-keras optimizers need none of this.

    Example:
        >>> import keras
        >>> import tensorflow as tf
        >>> bind_unbuilt_optimizer(keras.optimizers.Adam(), tf.distribute.get_strategy())
        True
    """
    if getattr(optimizer, "built", True) or not hasattr(optimizer, "_distribution_strategy"):
        return False
    optimizer._distribution_strategy = strategy
    return True


def weight_losses(model: Any) -> list[Any]:
    """``model.losses`` that depend on variables only (weight regularizers; in tf-keras also
    callables given to ``add_loss``), computed now: tf-keras keeps them as callables per layer,
    Keras 3 as each variable's ``regularizer``.

    Example:
        >>> keras = get_keras()
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(
        ...     1, kernel_initializer="ones", kernel_regularizer=keras.regularizers.L2(0.5))])
        >>> [float(loss) for loss in weight_losses(model)]
        [1.0]
    """
    if flavour_of(model) == "tf_keras":
        found = (c() for layer in model._flatten_layers() for c in layer._callable_losses)
        return [loss for loss in found if loss is not None]
    return [v.regularizer(v) for v in model.trainable_weights if v.regularizer is not None]


def call_losses(model: Any) -> list[Any]:
    """The losses ``model``'s last call added (activity regularizers, ``add_loss`` in
    ``call``): read them right after the call, in the same graph. Both Kerases clear them when
    a call starts; tf-keras keeps a functional model's symbolic ones apart.

    Example:
        >>> import numpy as np
        >>> keras = get_keras()
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(
        ...     1, kernel_initializer="ones", activity_regularizer=keras.regularizers.L1(1.0))])
        >>> _ = model(np.ones((2, 2), "float32"))
        >>> [float(loss) for loss in call_losses(model)]  # |2| + |2|, over 2 rows
        [2.0]
    """
    if flavour_of(model) == "tf_keras":
        return [loss for layer in model._flatten_layers() for loss in layer._eager_losses]
    return [loss for layer in model._flatten_layers() for loss in layer._get_own_losses()]


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


# ---------------------------------------------------------------------------- Keras 3 shims
SHIMS_ENV = "TFDIST_KERAS_SHIMS"
"""Set to ``off`` to install no Keras shim (Keras's own behaviour, e.g. to reproduce a bug)."""

_TRAINER = "keras.src.backend.tensorflow.trainer"
_installed: dict[str, bool] = {}
_log = logging.getLogger("tfdist")


def keras_version(version: str | None = None) -> tuple[int, ...]:
    """Keras 3's version as numbers (``"3.15.1"`` -> ``(3, 15, 1)``; default: the installed one).

    Example:
        >>> keras_version("3.15.1.dev2024"), keras_version("3.16.0rc1")
        ((3, 15, 1), (3, 16, 0))
    """
    if version is None:
        version = get_keras("keras3").__version__
    return tuple(int(re.match(r"\d+", part).group()) for part in version.split(".")[:3]
                 if re.match(r"\d+", part))


@dataclasses.dataclass(frozen=True)
class KerasShim:
    """One adaptation of Keras 3's TensorFlow trainer, applied only while Keras needs it.

    Attributes:
        name: Short name (logs, `install_keras3_shims`' result).
        issue: The upstream issue(s) it works around.
        first: The first Keras version with the bug (inclusive).
        fixed_in: The first Keras version without it (exclusive bound; None: not fixed yet).
        verified: The Keras versions the shim was tested with (tfdist's multi-process tests).
        still_broken: Reads Keras's code; False once a release has fixed the bug.
        install: Patches Keras (called at most once per process).
    """

    name: str
    issue: str
    first: tuple[int, ...]
    fixed_in: tuple[int, ...] | None
    verified: tuple[str, ...]
    still_broken: Callable[[], bool]
    install: Callable[[], None]

    def applies(self, version: tuple[int, ...] | None = None) -> bool:
        """Whether Keras ``version`` (default: the installed one) needs this shim.

        Example:
            >>> shim = KERAS3_SHIMS[0]
            >>> shim.applies((2, 15, 0)), shim.applies((3, 15, 1))
            (False, True)
        """
        version = keras_version() if version is None else version
        if version < self.first or (self.fixed_in is not None and version >= self.fixed_in):
            return False
        return self.still_broken()


def _source(qualname: str) -> str:
    module = importlib.import_module(_TRAINER)
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part)
    return inspect.getsource(getattr(target, "__wrapped_by_tfdist__", target))


def _is_multi_worker(strategy: Any) -> bool:
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and bool(
        strategy.extended._in_multi_worker_mode())


def _first_local(value: Any) -> Any:
    import tensorflow as tf

    if isinstance(value, tf.distribute.DistributedValues):
        return value.values[0]
    return value


def _install_symbolic_build() -> None:
    """Keras 3 builds a model before ``fit``/``evaluate`` from one batch, MEAN-reduced across
    replicas with ``strategy.reduce`` in eager mode; across workers that fails with
    ``Attempt to convert a value (PerReplica ...)``. Only the batch's shapes matter for the
    build, so under multi-worker the shim builds from this worker's first local replica."""
    trainer = importlib.import_module(_TRAINER)
    cls = trainer.TensorFlowTrainer
    original = cls._maybe_symbolic_build

    def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
        if self._distribute_strategy is None or not _is_multi_worker(self.distribute_strategy):
            return original(self, iterator=iterator, data_batch=data_batch)
        if iterator is not None:
            import tensorflow as tf

            for _, _, it in iterator:
                data_batch = tf.nest.map_structure(_first_local, next(it))
                break
        with self.distribute_strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    _maybe_symbolic_build.__wrapped_by_tfdist__ = original  # type: ignore[attr-defined]
    cls._maybe_symbolic_build = _maybe_symbolic_build


def _install_reduce_mean() -> None:
    """Keras 3's ``reduce_per_replica`` reduces ``"mean"``/``"auto"`` outputs (the metrics) across
    workers with ``strategy.reduce("MEAN", v, axis=0)``, which also reduces over the value's
    first axis: a scalar loss fails with "Invalid reduction dimension" (tensorflow#72388). The
    shim reduces across replicas only (``axis=None``), as the single-host branch does."""
    import tensorflow as tf

    trainer = importlib.import_module(_TRAINER)
    original = trainer.reduce_per_replica

    def reduce_per_replica(values: Any, strategy: Any, reduction: str) -> Any:
        if reduction in ("auto", "mean") and _is_multi_worker(strategy):
            return tf.nest.map_structure(
                lambda v: strategy.reduce("MEAN", v, axis=None), values)
        return original(values, strategy, reduction)

    reduce_per_replica.__wrapped_by_tfdist__ = original  # type: ignore[attr-defined]
    trainer.reduce_per_replica = reduce_per_replica


KERAS3_SHIMS: tuple[KerasShim, ...] = (
    KerasShim(
        name="multi_worker_symbolic_build",
        issue="keras#20585 (Keras 3 model.fit under MultiWorkerMirroredStrategy)",
        first=(3, 0, 0),
        fixed_in=None,
        verified=("3.15.1",),
        still_broken=lambda: "distribute_strategy.reduce(" in _source(
            "TensorFlowTrainer._maybe_symbolic_build"),
        install=_install_symbolic_build,
    ),
    KerasShim(
        name="multi_worker_reduce_mean",
        issue="tensorflow#72388 ('Invalid reduction dimension' in reduce_per_replica)",
        first=(3, 0, 0),
        fixed_in=None,
        verified=("3.15.1",),
        still_broken=lambda: 'reduce("MEAN", v, axis=0)' in _source("reduce_per_replica"),
        install=_install_reduce_mean,
    ),
    KerasShim(
        name="parameter_server_fit",
        issue="keras#18624 (Keras 3 model.fit has no ClusterCoordinator support)",
        first=(3, 0, 0),
        fixed_in=None,
        verified=("3.15.1",),
        still_broken=lambda: "ClusterCoordinator" not in inspect.getsource(
            importlib.import_module(_TRAINER)),
        install=lambda: None,  # nothing to patch: tfdist.fit drives the coordinator itself
    ),
)
"""The Keras 3 shims tfdist knows: two for ``model.fit`` under MultiWorkerMirroredStrategy, and
the route `tfdist.fit` takes under ParameterServerStrategy (`fit_needs_coordinator`)."""


def check_partitioner(partitioner: Any, flavour: KerasFlavour | None = None) -> None:
    """Raises if variables cannot be sharded (a ParameterServer partitioner) under this Keras.

    Keras 3 keeps a TF variable inside its own; a partitioned one is a ``ShardedVariable``,
    which ``tf.GradientTape`` cannot differentiate against (it has no ``handle``; measured on
    Keras 3.15.1 with TF 2.21), so every train step would fail.

    Example:
        >>> check_partitioner(None, "keras3")
        >>> check_partitioner(object(), "keras3")
        Traceback (most recent call last):
        ...
        tfdist.errors.KerasCompatibilityError: ...
    """
    if partitioner is None or (flavour or keras_flavour()) != "keras3":
        return
    raise KerasCompatibilityError(format_error(
        "ParameterServerStrategy cannot shard variables under Keras 3: tf.GradientTape cannot "
        "differentiate a Keras 3 variable that holds a ShardedVariable.",
        received=f"a variable partitioner ({type(partitioner).__name__}) with Keras 3",
        expected="no num_shards, min_shard_bytes or variable_partitioner under Keras 3",
        fix="drop the partitioner (whole variables are then placed round-robin over the ps "
        "tasks), or train with tf-keras (TF_USE_LEGACY_KERAS=1) to shard them"))


def fit_needs_coordinator(strategy: Any, model: Any = None) -> bool:
    """Whether ``model.fit`` cannot drive ``strategy``'s coordinator, so `tfdist.fit` must.

    True for a ParameterServerStrategy under Keras 3 (``model``'s flavour, else this
    process's) while Keras lacks the support (the ``parameter_server_fit`` shim applies).

    Example:
        >>> import tensorflow as tf
        >>> fit_needs_coordinator(tf.distribute.get_strategy())
        False
    """
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return False
    if (flavour_of(model) or keras_flavour()) != "keras3":
        return False
    return next(s for s in KERAS3_SHIMS if s.name == "parameter_server_fit").applies()


def shims_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """False when `SHIMS_ENV` is ``off`` (or ``0``/``false``/``no``).

    Example:
        >>> shims_enabled({"TFDIST_KERAS_SHIMS": "off"}), shims_enabled({})
        (False, True)
    """
    env = os.environ if environ is None else environ
    return env.get(SHIMS_ENV, "").strip().lower() not in ("off", "0", "false", "no")


def install_keras3_shims() -> dict[str, bool]:
    """Installs the Keras 3 shims this Keras needs, once per process; says which are active.

    Called by the strategies whose Keras 3 ``model.fit`` needs them (MultiWorkerMirrored); a
    no-op under tf-keras, when `SHIMS_ENV` is ``off``, and for a Keras that no longer needs them.

    Example:
        >>> sorted(install_keras3_shims())  # doctest: +SKIP
        ['multi_worker_reduce_mean', 'multi_worker_symbolic_build']
    """
    if keras_flavour() != "keras3" or not shims_enabled():
        return {}
    version = keras_version()
    for shim in KERAS3_SHIMS:
        if shim.name in _installed:
            continue
        needed = shim.applies(version)
        if needed:
            shim.install()
            if ".".join(map(str, version)) not in shim.verified:
                _log.info("tfdist: Keras shim %s (%s) installed on Keras %s; verified on %s.",
                          shim.name, shim.issue, version, ", ".join(shim.verified))
        _installed[shim.name] = needed
    return dict(_installed)
