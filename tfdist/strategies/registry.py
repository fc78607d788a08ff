"""The one map from a strategy name to its class; nothing else in tfdist branches on the name.

Built-in names: ``"default"``, ``"mirrored"``, ``"multi_worker"``, ``"parameter_server"``,
``"horovod"``, plus ``"auto"`` (chosen from the environment by `tfdist.strategies.detect`).
Every entry is stored as ``"module:Class"`` and imported only when asked for, so importing this
module does not import TensorFlow, and Horovod stays optional.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from typing import Any

from tfdist.errors import MissingDependencyError, StrategyConfigError, format_error

__all__ = [
    "AUTO",
    "SINGLE_PROCESS_STRATEGIES",
    "register",
    "get_strategy",
    "get_strategy_class",
    "available_strategies",
]

logger = logging.getLogger("tfdist")

AUTO = "auto"

SINGLE_PROCESS_STRATEGIES = ("default", "mirrored")
"""Built-in strategies that train in one process (its devices), with no cluster to launch."""

_REGISTRY: dict[str, str | type] = {}


def register(name: str, target: str | type, *, replace: bool = False) -> None:
    """Maps ``name`` to a strategy class, or to ``"module:Class"`` imported on first use.

    Args:
        name: The name `get_strategy` accepts.
        target: A `TfdistStrategyMixin` subclass, or ``"package.module:ClassName"``.
        replace: Allow overwriting an existing name.

    Raises:
        StrategyConfigError: ``name`` is taken (and ``replace`` is False), or is ``"auto"``.

    Example:
        >>> register("my_mirrored", "tfdist.strategies.mirrored:MirroredStrategy")
        >>> "my_mirrored" in available_strategies()
        True
        >>> _ = _REGISTRY.pop("my_mirrored")
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
    if name in _REGISTRY and not replace:
        raise StrategyConfigError(
            format_error(f"Strategy {name!r} is already registered.",
                         received=f"name={name!r}, target={target!r}",
                         expected=f"a name not in {available_strategies()}",
                         fix="pass replace=True to override it, or pick another name"))
    _REGISTRY[name] = target


def available_strategies() -> tuple[str, ...]:
    """Every name `get_strategy` accepts (registered, not necessarily importable), ``auto`` last.

    Example:
        >>> available_strategies()
        ('default', 'mirrored', 'multi_worker', 'parameter_server', 'horovod', 'auto')
    """
    return (*_REGISTRY, AUTO)


def get_strategy_class(name: str) -> type:
    """The class registered as ``name``, importing it if needed (``"auto"`` is not a class).

    Raises:
        StrategyConfigError: ``name`` is not registered; the message lists the valid names.
        MissingDependencyError: its module cannot be imported (e.g. Horovod is not installed).

    Example:
        >>> get_strategy_class("mirrored").__name__
        'MirroredStrategy'
    """
    if name not in _REGISTRY:
        import difflib

        close = difflib.get_close_matches(str(name), available_strategies(), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise StrategyConfigError(
            format_error(f"Unknown strategy {name!r}.", received=repr(name),
                         expected=f"one of {', '.join(available_strategies())}",
                         fix=f"{hint}or register your own with tfdist.strategies.register()"))
    target = _REGISTRY[name]
    if isinstance(target, str):
        target = _import(name, target)
        _REGISTRY[name] = target
    return target


def _import(name: str, target: str) -> type:
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except MissingDependencyError:
        raise
    except ImportError as err:
        raise MissingDependencyError(
            format_error(f"Strategy {name!r} cannot be imported ({err}).", received=target,
                         expected=f"an importable module {module_name!r}",
                         fix=f"install what it needs (for 'horovod': bash launch/setup.sh), "
                         f"or pick another of {', '.join(available_strategies())}")
        ) from err
    return getattr(module, class_name)


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

    ``"auto"`` picks a name with `tfdist.strategies.detect.detect_strategy` and logs one line on
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
        from tfdist.strategies.detect import detect_strategy

        name, reason = detect_strategy()
        logger.info("tfdist chose strategy %r: %s.", name, reason)
    cls = get_strategy_class(name)
    _check_options(name, cls, options)
    return cls(**options)


_BUILTINS = {
    "default": "tfdist.strategies.default:DefaultStrategy",
    "mirrored": "tfdist.strategies.mirrored:MirroredStrategy",
    "multi_worker": "tfdist.strategies.multi_worker:MultiWorkerMirroredStrategy",
    "parameter_server": "tfdist.strategies.parameter_server:ParameterServerStrategy",
    "horovod": "tfdist.strategies.horovod:HorovodStrategy",
}
for _name, _target in _BUILTINS.items():
    register(_name, _target)
