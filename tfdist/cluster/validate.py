"""Every check on a cluster, its TF_CONFIG and its fit with a strategy.

Each function takes plain data and either returns the checked value or raises a
`tfdist.errors.ClusterConfigError` whose message names the field, the value received, what was
expected and how to fix it. All of it runs before any process starts.

``where`` arguments name what is being read (``"TF_CONFIG"``, ``"cluster spec"``) and start the
message: ``Invalid TF_CONFIG: ...``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tfdist.cluster._error import config_error, show
from tfdist.cluster.address import split_address
from tfdist.cluster.roles import (
    CHIEF,
    EVALUATOR,
    PS,
    ROLES,
    WORKER,
    Task,
    check_role,
)
from tfdist.core.traits import StrategyTraits

__all__ = [
    "Roles",
    "check_role_list",
    "check_roles",
    "check_cluster_mapping",
    "check_index",
    "check_task_in_cluster",
    "check_task_mapping",
    "check_strategy",
]

Roles = Mapping[str, Sequence[str]]
"""A cluster as plain data: role -> addresses (``{"worker": ["h1:2222", "h2:2222"]}``)."""

TASK_KEYS = ("type", "index")
_IGNORED_TASK_KEYS = ("trial", "cloud")  # Set by Cloud ML Engine / Vertex AI; TF ignores them.


def check_role_list(role: str, value: object, where: str, allow_empty: bool) -> tuple[str, ...]:
    """Returns the addresses of ``role`` as a tuple, checking it is a list of strings.

    Example:
        >>> check_role_list("worker", ["h1:2222"], "TF_CONFIG", allow_empty=False)
        ('h1:2222',)
    """
    field = f"cluster.{role}"
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise config_error(
            where, f"{field} is not a list of 'host:port' strings.", received=show(value),
            expected='a list such as ["node01:2222"]', fix=f'Write "{role}": ["host:port", ...].',
        )
    if not value and not allow_empty:
        raise config_error(
            where, f"{field} is an empty list.", received="[]",
            expected="at least one 'host:port'", fix=f'List its tasks or remove the "{role}" key.',
        )
    for index, address in enumerate(value):
        split_address(address, f"{field}[{index}]", where)
    return tuple(value)


def _check_at_most_one(roles: Roles, role: str, where: str) -> None:
    addresses = roles.get(role, ())
    if len(addresses) > 1:
        fix = (
            'Keep one chief and list the others under "worker".'
            if role == CHIEF
            else "Keep one evaluator; it evaluates every checkpoint the job writes."
        )
        raise config_error(
            where, f"cluster.{role} lists {len(addresses)} tasks; there can be only one {role}.",
            received=show(list(addresses)), expected=f"at most one {role}",
            fix=fix,
        )


def _check_unique_addresses(roles: Roles, where: str) -> None:
    seen: dict[tuple[str, int], Task] = {}
    for role in ROLES:
        for index, address in enumerate(roles.get(role, ())):
            host, port = split_address(address, f"cluster.{role}[{index}]", where)
            task = Task(role, index)
            other = seen.setdefault((host.lower(), port), task)
            if other != task:
                raise config_error(
                    where, f"tasks {other} and {task} have the same address.",
                    received=show(address), expected="a distinct host:port for every task",
                    fix=f"Give {task} another port.",
                )


def check_roles(roles: Roles, where: str = "cluster spec") -> None:
    """Generic checks of a whole cluster (valid for every strategy).

    Checks: known role names, addresses, at most one chief and one evaluator, no address used
    twice, and at least one chief or worker (ps tasks alone have nothing to train them).

    Example:
        >>> check_roles({"chief": ["h1:2222"], "worker": ["h1:2223"]})
    """
    for role, addresses in roles.items():
        check_role(role, "cluster role", where)
        check_role_list(role, addresses, where, allow_empty=True)
    _check_at_most_one(roles, CHIEF, where)
    _check_at_most_one(roles, EVALUATOR, where)
    _check_unique_addresses(roles, where)
    _check_has_trainer(roles, where)


def _check_has_trainer(roles: Roles, where: str) -> None:
    """Refuses a cluster without a chief or a worker: nothing in it would train."""
    if roles.get(CHIEF) or roles.get(WORKER):
        return
    received = show({role: list(v) for role, v in roles.items()})
    if roles.get(PS):
        raise config_error(
            where, "a cluster with ps tasks needs a chief or workers to train; ps tasks only "
            "hold variables.", received=received, expected="at least one chief or worker task",
            fix='Add workers or a chief (e.g. "worker": ["host:2222"], or workers=1 / chief=True '
            "in a builder).",
        )
    raise config_error(
        where, "the cluster has no chief, worker or ps task.", received=received,
        expected="at least one worker (or a chief)", fix='Add e.g. "worker": ["host:2222"].',
    )


def check_cluster_mapping(cluster: object, where: str = "TF_CONFIG") -> dict[str, tuple[str, ...]]:
    """Checks the ``cluster`` object of a TF_CONFIG; returns role -> addresses in canonical order.

    Example:
        >>> check_cluster_mapping({"worker": ["h1:2222"]})
        {'worker': ('h1:2222',)}
    """
    if not isinstance(cluster, Mapping):
        raise config_error(
            where, '"cluster" is not an object.', received=show(cluster),
            expected='{"worker": ["host:port", ...], ...}', fix="Map each role to its addresses.",
        )
    for role, value in cluster.items():
        check_role(role, "cluster role", where)
        check_role_list(role, value, where, allow_empty=False)
    roles = {role: tuple(cluster[role]) for role in ROLES if role in cluster}
    check_roles(roles, where)
    return roles


def check_index(value: object, field: str, where: str) -> int:
    """Returns ``value`` if it is an int >= 0 (bools and numeric strings are rejected).

    Example:
        >>> check_index(1, "task.index", "TF_CONFIG")
        1
    """
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, bool):
        fix = f"Use the number {int(value)}, not {str(value).lower()}."
    elif isinstance(value, str) and value.strip().isdigit():
        fix = f"Use the number {int(value)}, not the string {value!r}."
    elif isinstance(value, float) and value.is_integer() and value >= 0:
        fix = f"Use the integer {int(value)}."
    else:
        fix = "Use the task's position within its role, counting from 0."
    raise config_error(
        where, f"{field} is not an integer >= 0.", received=show(value),
        expected="a JSON integer such as 0 or 1", fix=fix,
    )


def check_task_in_cluster(roles: Roles, task: Task, where: str, field: str = "task") -> None:
    """Checks that ``task`` is one of the cluster's tasks.

    An evaluator absent from the cluster is valid as ``evaluator:0``: it is how tfdist writes the
    evaluator's TF_CONFIG (its cluster is the training cluster, without the evaluator).

    Example:
        >>> check_task_in_cluster({"worker": ["h:1"]}, Task("evaluator", 0), "TF_CONFIG")
    """
    count = len(roles.get(task.type, ()))
    if task.type == EVALUATOR:
        count = max(count, 1)
    if count == 0:
        present = ", ".join(role for role in ROLES if roles.get(role)) or "none"
        raise config_error(
            where, f"{field}.type {task.type!r} has no tasks in the cluster.",
            received=f"{field}.type={task.type!r} with cluster roles {present}",
            expected=f'a role listed in the cluster, or a cluster with a "{task.type}" entry',
            fix=f'Add "{task.type}": ["host:port"] to the cluster or fix the task type.',
        )
    if task.index >= count:
        raise config_error(
            where, f"{field}.index {task.index} is out of range for role {task.type!r}.",
            received=f"{field}={{'type': {task.type!r}, 'index': {task.index}}}",
            expected="0 (there is one evaluator)" if task.type == EVALUATOR
            else f"an index in 0..{count - 1} (the cluster lists {count} {task.type} tasks)",
            fix="Use an index below the number of tasks of that role.",
        )


def check_task_mapping(task: object, roles: Roles, where: str = "TF_CONFIG") -> Task:
    """Checks the ``task`` object of a TF_CONFIG against its cluster; returns the `Task`.

    Example:
        >>> check_task_mapping({"type": "worker", "index": 0}, {"worker": ["h:1"]})
        Task(type='worker', index=0)
    """
    if not isinstance(task, Mapping):
        raise config_error(
            where, '"task" is not an object.', received=show(task),
            expected='{"type": "worker", "index": 0}', fix="Write the task as a JSON object.",
        )
    unknown = [key for key in task if key not in TASK_KEYS + _IGNORED_TASK_KEYS]
    missing = [key for key in TASK_KEYS if key not in task]
    if unknown or missing:
        problem = f"task has unknown keys {unknown}." if unknown else f"task lacks {missing}."
        raise config_error(
            where, problem, received=show(dict(task)),
            expected='exactly the keys "type" and "index"',
            fix='Write the task as {"type": "worker", "index": 0}.',
        )
    role = check_role(task["type"], "task.type", where)
    result = Task(role, check_index(task["index"], "task.index", where))
    check_task_in_cluster(roles, result, where)
    return result


def check_strategy(
    roles: Roles, strategy: str, traits: StrategyTraits, where: str = "cluster spec"
) -> None:
    """Checks that the cluster fits the traits of the strategy named ``strategy``.

    The caller looks the traits up (`tfdist.cluster.strategy.check_fits`), so this layer keeps
    no list of strategies of its own.

    Example:
        >>> from tfdist.core.traits import PARAMETER_SERVER
        >>> roles = {"chief": ["h:1"], "worker": ["h:2"], "ps": ["h:3"]}
        >>> check_strategy(roles, "parameter_server", PARAMETER_SERVER)
    """
    counts = {role: len(roles.get(role, ())) for role in ROLES}
    present = show({r: list(roles[r]) for r in roles if roles[r]})
    for role, why in traits.required_roles.items():
        if not counts[role]:
            raise config_error(
                where, f"strategy {strategy!r} needs a {role} task ({why}).",
                received=present,
                expected=f"at least one {role}" if role != CHIEF else "exactly one chief",
                fix=f"Add a {role} (e.g. {role}={'True' if role == CHIEF else '1'} in a builder).",
            )
    if not counts[WORKER] + counts[CHIEF]:
        raise config_error(
            where, f"strategy {strategy!r} needs at least one worker or chief.",
            received=present, expected="one or more worker (or chief) tasks",
            fix="Add workers (e.g. workers=2).",
        )
    if counts[PS] and not traits.has_role(PS):
        raise config_error(
            where, f"strategy {strategy!r} does not use parameter servers, but the cluster has "
            f"{counts[PS]} ps task(s).", received=f"ps={list(roles[PS])}",
            expected=f"no 'ps' role with strategy {strategy!r}",
            fix="Remove the ps tasks (ps=0) or use strategy 'parameter_server'.",
        )

