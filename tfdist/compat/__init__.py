"""The Keras 3 shim table: what tfdist patches in Keras 3, why, and for which versions.

Which Keras is in use is `tfdist.core.flavour`'s; which one a strategy trains with is its traits'
(`tfdist.core.traits.StrategyTraits.check_keras`); what the model-parallel engines need that the
two Kerases give differently is in `tfdist.compat.models`.

Keras 3 shims (`KERAS3_SHIMS`): each names the upstream issue, the Keras versions it applies to,
the versions it was checked against, and a probe of Keras's own code that says whether the bug is
still there; a Keras release that fixes the bug (or a version outside the range) switches the
shim off by itself. `install_keras3_shims` applies those that are needed, once per process (in
every task ``tfdist-launch`` starts, through `tfdist.startup_hook`, even for a script that never
imports tfdist); ``TFDIST_KERAS_SHIMS=off`` turns them all off (to see Keras's own behaviour).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from tfdist.core.flavour import flavour_of, get_keras, keras_flavour

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


def _install_coordinator_fit() -> None:
    """Keras 3's ``fit``/``evaluate`` cannot drive a ``ClusterCoordinator``; under
    ParameterServerStrategy the shim runs tfdist's coordinator loop instead
    (`tfdist.coordinator_fit`), so a script written like TensorFlow's parameter-server guide
    trains unchanged. Under every other strategy Keras's own methods run."""
    cls = importlib.import_module(_TRAINER).TensorFlowTrainer
    for name in ("fit", "evaluate"):
        setattr(cls, name, _routed(getattr(cls, name), f"coordinator_{name}"))


def _routed(original: Callable[..., Any], route: str) -> Callable[..., Any]:
    signature = inspect.signature(original)

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not fit_needs_coordinator(self.distribute_strategy, self):
            return original(self, *args, **kwargs)
        given = signature.bind(self, *args, **kwargs).arguments
        given.pop("self")
        given.update(given.pop("kwargs", {}))
        coordinator_fit = importlib.import_module("tfdist.coordinator_fit")
        return getattr(coordinator_fit, route)(self, **given)

    method.__wrapped_by_tfdist__ = original  # type: ignore[attr-defined]
    method.__name__, method.__doc__ = original.__name__, original.__doc__
    return method


def _install_optimizer_built_before_fit() -> None:
    """With no distribution strategy, Keras 3 defers building (``_maybe_symbolic_build``), so
    the optimizer makes its slots (Adam's moments) inside the first trace of the train step, and
    a ``tf.function`` whose first trace creates variables traces again: every step is traced
    twice (1.7 CPU-s instead of 0.75 for a small MLP's Adam ``fit``). The shim builds the
    optimizer before ``fit`` when the model is built, as its first ``apply`` would (same
    variables, same name scope, same values); an unbuilt model is left to Keras."""
    cls = importlib.import_module(_TRAINER).TensorFlowTrainer
    current = cls.fit

    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._distribute_strategy is None:
            _build_optimizer(self)
        return current(self, *args, **kwargs)

    fit.__wrapped_by_tfdist__ = getattr(current, "__wrapped_by_tfdist__", current)  # type: ignore[attr-defined]
    fit.__name__, fit.__doc__ = current.__name__, current.__doc__
    cls.fit = fit


def _build_optimizer(model: Any) -> None:
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or optimizer.built:
        return
    if not all(layer.built for layer in model._flatten_layers()):
        return
    from keras.src import backend

    with backend.name_scope(optimizer.name, caller=optimizer):  # as its first `apply` would
        optimizer.build(model.trainable_variables)


_TF_KERAS_ONLY = {"experimental": "tf.keras.utils.experimental.DatasetCreator"}


def _install_tf_keras_only_names() -> None:
    """``tf.keras.utils.experimental`` (``DatasetCreator``, which TensorFlow's parameter-server
    guide feeds ``model.fit``) is tf-keras's; Keras 3 has no such name, and its AttributeError
    does not say why. The shim's error names the fix, as Keras 3's own
    ``keras.optimizers.legacy`` does."""
    utils = importlib.import_module("keras.utils")
    original = getattr(utils, "__getattr__", None)

    def __getattr__(name: str) -> Any:
        if name in _TF_KERAS_ONLY:
            raise AttributeError(
                f"`keras.utils.{name}` ({_TF_KERAS_ONLY[name]}) is tf-keras (Keras 2) only; "
                "Keras 3 does not have it. Fix: set TF_USE_LEGACY_KERAS=1 before importing "
                "TensorFlow (tfdist-launch passes it to every task) so that tf.keras is "
                "tf-keras, or under Keras 3 pass model.fit a dataset_fn(input_context) with "
                "steps_per_epoch (tfdist runs it through the coordinator).")
        if original is not None:
            return original(name)
        raise AttributeError(f"module 'keras.utils' has no attribute {name!r}")

    utils.__getattr__ = __getattr__  # type: ignore[attr-defined]


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
        install=_install_coordinator_fit,
    ),
    KerasShim(
        name="tf_keras_only_names",
        issue="tf.keras.utils.experimental.DatasetCreator is absent from Keras 3",
        first=(3, 0, 0),
        fixed_in=None,
        verified=("3.15.1",),
        still_broken=lambda: not hasattr(importlib.import_module("keras.utils"), "experimental"),
        install=_install_tf_keras_only_names,
    ),
    KerasShim(
        name="optimizer_built_before_fit",
        issue="tensorflow#48851 (a tf.function that creates variables on its first call traces "
              "twice): Keras 3 builds the optimizer in the first trace when no strategy is set",
        first=(3, 0, 0),
        fixed_in=None,
        verified=("3.15.1",),
        still_broken=lambda: "if self._distribute_strategy is None:" in _source(
            "TensorFlowTrainer._maybe_symbolic_build"),
        install=_install_optimizer_built_before_fit,
    ),
)
"""The Keras 3 shims tfdist knows: two for ``model.fit`` under MultiWorkerMirroredStrategy, the
route of ``model.fit``/``evaluate`` (and `tfdist.fit`) under ParameterServerStrategy
(`fit_needs_coordinator`), an error that names the fix for tf-keras-only names, and the
optimizer built before a strategy-less ``fit`` (its step then traced once, not twice)."""


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

    Called by the strategies whose Keras 3 ``model.fit`` needs them (MultiWorkerMirrored) and by
    the launcher's start-up hook once Keras is imported (`tfdist.startup_hook`); a no-op under
    tf-keras, when `SHIMS_ENV` is ``off``, and for a Keras that no longer needs them.

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
