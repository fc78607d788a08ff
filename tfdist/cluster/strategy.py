"""Whether a cluster fits a strategy named by the user: the name looked up once, then checked.

The registry (`tfdist.core.registry`) owns which roles each strategy's cluster may have; this
module turns a name into its traits (or a `ClusterConfigError` naming the known strategies) and
hands them to `tfdist.cluster.validate.check_strategy`, which never sees the registry.
"""

from __future__ import annotations

from tfdist.cluster._error import config_error, show
from tfdist.cluster.validate import Roles, check_strategy
from tfdist.core.registry import AUTO, available_strategies, check_strategy_name, strategy_traits
from tfdist.core.traits import StrategyTraits
from tfdist.errors import StrategyConfigError

__all__ = ["check_fits", "lookup_traits"]


def lookup_traits(strategy: object) -> StrategyTraits:
    """The traits of the strategy named ``strategy``, as a cluster check reports an unknown name.

    Example:
        >>> lookup_traits("multi_worker").launch
        'tasks'
    """
    try:
        if strategy == AUTO:
            raise StrategyConfigError("'auto' is not a strategy of its own")
        return strategy_traits(check_strategy_name(strategy))
    except StrategyConfigError:
        pass
    raise config_error(
        "strategy", f"{show(strategy)} is not a known strategy name.", received=show(strategy),
        expected=f"None or one of {', '.join(available_strategies()[:-1])}",
        fix="Pass one of the expected names (or None for generic checks only).",
    )


def check_fits(roles: Roles, strategy: str | None, where: str) -> None:
    """Checks that ``roles`` fits the strategy named ``strategy`` (None: no strategy check).

    Example:
        >>> check_fits({"chief": ["h:1"], "ps": ["h:2"]}, "parameter_server", "cluster spec")
        >>> check_fits({"worker": ["h:1"]}, None, "cluster spec")
    """
    if strategy is not None:
        check_strategy(roles, strategy, lookup_traits(strategy), where)
