"""The one map from a strategy name to its class and traits; nothing else branches on the name.

Built-in names: ``"default"``, ``"mirrored"``, ``"multi_worker"``, ``"parameter_server"``,
``"horovod"``, ``"pipeline"``, ``"tensor"``, plus ``"auto"`` (chosen from the environment by
`tfdist.core.detect`). Adding a built-in is its class's file under ``tfdist/strategies/``, its
traits in `tfdist.core.traits` (so that they are known without TensorFlow) and one line in
``_BUILTINS``; a strategy of your own is its file and one line (below).
Three more ways to name a strategy, each accepted by `get_strategy` and ``tfdist-launch
--strategy`` alike:

* a name given to `register` (a class, or ``"module:Class"`` imported on first use);
* ``"package.module:Class"`` itself, imported and registered under that name on first use;
* an entry point in the ``tfdist.strategies`` group of an installed package
  (``[project.entry-points."tfdist.strategies"] my_mirrored = "mypkg.strategies:MyMirrored"``).

A strategy's traits (`tfdist.core.traits.StrategyTraits`) live on its class as
``cls.traits``. The built-ins' traits are also stored here, beside their lazy targets, so that
`strategy_traits` answers for them without importing TensorFlow: the launcher, validation and the
exports read traits, and stay fast. Importing this module imports neither TensorFlow nor Horovod.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from typing import Any

from tfdist.core import traits as builtin_traits
from tfdist.core.traits import StrategyTraits
from tfdist.errors import MissingDependencyError, StrategyConfigError, format_error

__all__ = [
    "AUTO",
    "ENTRY_POINT_GROUP",
    "register",
    "get_strategy",
    "get_strategy_class",
    "strategy_traits",
    "check_strategy_name",
    "available_strategies",
    "strategies_taking",
    "unregister",
]

logger = logging.getLogger("tfdist")

AUTO = "auto"
ENTRY_POINT_GROUP = "tfdist.strategies"

_REGISTRY: dict[str, str | type] = {}
_TRAITS: dict[str, StrategyTraits] = {}


def register(
    name: str, target: str | type, *, traits: StrategyTraits | None = None, replace: bool = False
) -> None:
    """Maps ``name`` to a strategy class, or to ``"module:Class"`` imported on first use.

    Args:
        name: The name `get_strategy` and ``tfdist-launch --strategy`` accept.
        target: A `TfdistStrategyMixin` subclass, or ``"package.module:ClassName"``.
        traits: The strategy's traits when ``target`` is a string and they should be known
            without importing it; by default they are read from the class (``cls.traits``).
        replace: Allow overwriting an existing name.

    Raises:
        StrategyConfigError: ``name`` is taken (and ``replace`` is False), or is ``"auto"``.

    Example:
        >>> register("my_mirrored", "tfdist.strategies.mirrored:MirroredStrategy")
        >>> "my_mirrored" in available_strategies()
        True
        >>> unregister("my_mirrored")
    """
    if not isinstance(name, str) or not name or name == AUTO:
        raise StrategyConfigError(
            format_error("A strategy name must be a non-empty string other than 'auto'.",
                         received=repr(name), expected="a new name such as 'my_strategy'",
                         fix="pick another name"))
    if isinstance(target, str) and ":" not in target:
        raise StrategyConfigError(
            format_error("A lazy strategy target names a module and a class.",
                         received=repr(target), expected="'package.module:ClassName'",
                         fix=f"write e.g. 'mypackage.strategies:{target.rsplit('.', 1)[-1]}'"))
    if not isinstance(target, str):
        _check_class(name, target)
    if name in _REGISTRY and not replace:
        raise StrategyConfigError(
            format_error(f"Strategy {name!r} is already registered.",
                         received=f"name={name!r}, target={target!r}",
                         expected=f"a name not in {available_strategies()}",
                         fix="pass replace=True to override it, or pick another name"))
    _REGISTRY[name] = target
    _TRAITS.pop(name, None)
    if traits is not None:
        _TRAITS[name] = traits


def unregister(name: str) -> None:
    """Forgets ``name`` (a no-op when it is not registered)."""
    _REGISTRY.pop(name, None)
    _TRAITS.pop(name, None)


def _check_class(name: str, cls: Any) -> None:
    if not isinstance(cls, type) or not isinstance(getattr(cls, "traits", None), StrategyTraits):
        raise StrategyConfigError(
            format_error(f"Strategy {name!r} is not a tfdist strategy class.",
                         received=repr(cls),
                         expected="a class with a StrategyTraits `traits` attribute, e.g. a "
                         "subclass of tfdist.MirroredStrategy or of TfdistStrategyMixin and a "
                         "tf.distribute.Strategy",
                         fix="subclass a tfdist strategy (it inherits its traits), or set "
                         "`traits = tfdist.core.traits.StrategyTraits(...)` on the class"))


def available_strategies() -> tuple[str, ...]:
    """Every registered name (not necessarily importable), ``auto`` last.

    ``package.module:Class`` names are accepted too, and are not listed.

    Example:
        >>> available_strategies()  # doctest: +NORMALIZE_WHITESPACE
        ('default', 'mirrored', 'multi_worker', 'parameter_server', 'horovod', 'pipeline',
         'tensor', 'auto')
    """
    return (*(name for name in _REGISTRY if ":" not in name), AUTO)


def strategies_taking(option: str) -> tuple[str, ...]:
    """The registered strategies whose traits take the launcher option ``option`` (``"stages"``,
    ``"tensor"``), among those whose traits are known without importing them.

    Example:
        >>> strategies_taking("stages")
        ('pipeline',)
    """
    known = {name: _TRAITS.get(name, getattr(target, "traits", None))
             for name, target in _REGISTRY.items() if ":" not in name}
    return tuple(name for name, traits in known.items()
                 if traits is not None and option in traits.launch_options)


def get_strategy_class(name: str) -> type:
    """The class registered as ``name``, importing it if needed (``"auto"`` is not a class).

    Raises:
        StrategyConfigError: ``name`` is not registered; the message lists the valid names.
        MissingDependencyError: its module cannot be imported (e.g. Horovod is not installed).

    Example:
        >>> get_strategy_class("mirrored").__name__
        'MirroredStrategy'
    """
    _find(name)
    target = _REGISTRY[name]
    if isinstance(target, str):
        target = _import(name, target)
        _check_class(name, target)
        _REGISTRY[name] = target
    return target


def strategy_traits(name: str) -> StrategyTraits:
    """The traits of the strategy ``name``; built-ins answer without importing TensorFlow.

    Raises:
        StrategyConfigError: ``name`` is not a strategy (``"auto"`` is resolved first).
        MissingDependencyError: a lazily registered class cannot be imported.

    Example:
        >>> strategy_traits("parameter_server").server_roles
        ('worker', 'ps')
    """
    _find(name)
    if name not in _TRAITS:
        _TRAITS[name] = get_strategy_class(name).traits
    return _TRAITS[name]


def check_strategy_name(name: object) -> str:
    """Returns ``name`` if it names a strategy (``"auto"`` included), else raises.

    Example:
        >>> check_strategy_name("tfdist.strategies.mirrored:MirroredStrategy")
        'tfdist.strategies.mirrored:MirroredStrategy'
    """
    if name != AUTO:
        _find(name)
    return name  # type: ignore[return-value]


def _find(name: object) -> None:
    """Makes sure ``name`` is registered: as given, as ``module:Class``, or as an entry point."""
    if isinstance(name, str):
        if name in _REGISTRY:
            return
        module, _, cls = name.partition(":")
        target = name if module.strip() and cls.strip() else _entry_point(name)
        if target is not None:
            register(name, target)
            return
    import difflib

    close = difflib.get_close_matches(str(name), available_strategies(), n=1)
    hint = f"did you mean {close[0]!r}? Or " if close else ""
    raise StrategyConfigError(
        format_error(f"Unknown strategy {name!r}.", received=repr(name),
                     expected=f"one of {', '.join(available_strategies())}, or "
                     "'package.module:Class'",
                     fix=f"{hint}register your own with tfdist.strategies.register(), or name "
                     f"its class as 'package.module:Class', or declare it in the "
                     f"{ENTRY_POINT_GROUP!r} entry-point group"))


def _entry_point(name: str) -> str | None:
    from importlib import metadata  # 20 ms at import: every task the launcher starts pays it

    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name == name:
            return entry.value
    return None


def _import(name: str, target: str) -> type:
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name.strip())
    except MissingDependencyError:
        raise
    except ImportError as err:
        raise MissingDependencyError(
            format_error(f"Strategy {name!r} cannot be imported ({err}).", received=target,
                         expected=f"an importable module {module_name!r}",
                         fix=f"install what it needs (for 'horovod': bash launch/setup.sh), "
                         f"or pick another of {', '.join(available_strategies())}")
        ) from err
    cls = getattr(module, class_name.strip(), None)
    if cls is None:
        raise StrategyConfigError(
            format_error(f"Strategy {name!r}: module {module_name!r} has no {class_name!r}.",
                         received=target, expected=f"a class {class_name!r} in {module_name!r}",
                         fix="check the class name (it is case-sensitive)"))
    return cls


def _check_options(name: str, cls: type, options: dict[str, Any]) -> None:
    params = inspect.signature(cls.__init__).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    valid = [p.name for p in params if p.name != "self" and p.kind in (
        inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise StrategyConfigError(
            format_error(f"Unknown option(s) for strategy {name!r}: {', '.join(unknown)}.",
                         received=", ".join(f"{k}={options[k]!r}" for k in unknown),
                         expected=f"options of {name!r}: {', '.join(valid) or '(none)'}",
                         fix="remove or rename them (see help(tfdist.strategies."
                         f"{cls.__name__}))"))


def get_strategy(name: str = AUTO, **options: Any) -> Any:
    """Creates the strategy registered as ``name``, with ``options`` passed to its constructor.

    ``"auto"`` picks a name with `tfdist.core.detect.detect_strategy` and logs one line on
    the ``"tfdist"`` logger saying what it chose and why.

    Raises:
        StrategyConfigError: unknown name, unknown option or invalid option value, or an
            environment that contradicts itself (TF_CONFIG and Horovod ranks at once).
        KerasCompatibilityError: this Keras cannot train with the strategy.
        ClusterConfigError: TF_CONFIG is missing or wrong for a multi-process strategy.

    Example:
        >>> get_strategy("default").num_replicas_in_sync
        1
    """
    if name == AUTO:
        from tfdist.core.detect import detect_strategy

        name, reason = detect_strategy()
        logger.info("tfdist chose strategy %r: %s.", name, reason)
    cls = get_strategy_class(name)
    _check_options(name, cls, options)
    return cls(**options)


_BUILTINS = {
    "default": ("tfdist.strategies.default:DefaultStrategy", builtin_traits.DEFAULT),
    "mirrored": ("tfdist.strategies.mirrored:MirroredStrategy", builtin_traits.MIRRORED),
    "multi_worker": ("tfdist.strategies.multi_worker:MultiWorkerMirroredStrategy",
                     builtin_traits.MULTI_WORKER),
    "parameter_server": ("tfdist.strategies.parameter_server:ParameterServerStrategy",
                         builtin_traits.PARAMETER_SERVER),
    "horovod": ("tfdist.strategies.horovod:HorovodStrategy", builtin_traits.HOROVOD),
    "pipeline": ("tfdist.strategies.pipeline:PipelineStrategy", builtin_traits.PIPELINE),
    "tensor": ("tfdist.strategies.tensor:TensorStrategy", builtin_traits.TENSOR),
}
for _name, (_target, _traits) in _BUILTINS.items():
    register(_name, _target, traits=_traits)
