"""Reading and writing the ``TF_CONFIG`` environment variable, as plain data.

A TF_CONFIG is JSON with two keys: ``cluster`` (role -> list of ``host:port``) and ``task``
(``{"type": role, "index": i}``). tfdist writes exactly these two keys, and never lists the
evaluator in ``cluster``: a ParameterServer or MultiWorker job whose cluster holds an evaluator
hangs (tensorflow#46169). The evaluator's own TF_CONFIG is the training cluster plus
``"task": {"type": "evaluator", "index": 0}``, which TensorFlow reads fine.

`tfdist.cluster.ClusterSpec` wraps these functions; use them directly only for plain dicts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from tfdist.cluster._error import config_error, show
from tfdist.cluster.roles import TRAINING_ROLES, Task
from tfdist.cluster.validate import Roles, check_cluster_mapping, check_task_mapping
from tfdist.core.environ import TF_CONFIG

__all__ = ["load_tf_config", "parse_tf_config", "make_tf_config"]

_EXAMPLE = '{"cluster": {"worker": ["host:2222"]}, "task": {"type": "worker", "index": 0}}'


def _from_environment() -> str:
    text = os.environ.get(TF_CONFIG, "")
    if not text.strip():
        raise config_error(
            TF_CONFIG, "the TF_CONFIG environment variable is not set or empty.",
            received=show(text) if TF_CONFIG in os.environ else "unset",
            expected=f"JSON such as {_EXAMPLE}",
            fix="Set TF_CONFIG for each process (tfdist's launcher does this), or pass it in.",
        )
    return text


def _decode(text: str) -> object:
    """Decodes JSON; every failure (syntax, nesting too deep, a huge number) is a config error."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        start = max(error.pos - 20, 0)
        raise config_error(
            TF_CONFIG,
            f"it is not valid JSON ({error.msg} at line {error.lineno} column {error.colno}, "
            f"char {error.pos}).", received=show(text[start : error.pos + 20]),
            expected=f"JSON such as {_EXAMPLE}",
            fix="Use double quotes around keys and strings, and no trailing commas.",
        ) from None
    except (RecursionError, ValueError) as error:
        deep = isinstance(error, RecursionError)
        why = "it nests too deeply" if deep else str(error).split(";")[0]  # Not Python's advice.
        raise config_error(
            TF_CONFIG, f"it cannot be decoded as JSON ({why}).",
            received=f"{len(text)} characters starting {show(text[:40])}",
            expected=f"a small JSON object such as {_EXAMPLE}",
            fix="Set TF_CONFIG to the cluster and task only, as tfdist's launcher writes it.",
        ) from None


def load_tf_config(value: str | Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """Returns a TF_CONFIG as a mapping, decoding JSON; None reads ``os.environ["TF_CONFIG"]``.

    Only JSON and the top level are checked here; see `parse_tf_config` for the rest.

    Example:
        >>> load_tf_config('{"cluster": {}, "task": {}}')
        {'cluster': {}, 'task': {}}
    """
    if isinstance(value, Mapping):
        decoded: object = value
    elif value is None or isinstance(value, str):
        decoded = _decode(_from_environment() if value is None else value)
    else:
        raise config_error(
            TF_CONFIG, "it is neither JSON text nor a mapping.", received=show(value),
            expected="a str, a Mapping or None", fix="Pass os.environ['TF_CONFIG'] or a dict.",
        )
    if not isinstance(decoded, Mapping):
        raise config_error(
            TF_CONFIG, "it is not a JSON object.", received=show(decoded),
            expected=f"an object such as {_EXAMPLE}", fix="Wrap the cluster and task in {...}.",
        )
    if "cluster" not in decoded:
        raise config_error(
            TF_CONFIG, 'it has no "cluster" key; without it TensorFlow silently trains each '
            "process alone.", received=show(dict(decoded)),
            expected=f"an object such as {_EXAMPLE}",
            fix='Add "cluster": {"worker": ["host:port", ...]} listing every task.',
        )
    if "task" not in decoded:
        raise config_error(
            TF_CONFIG, 'it has no "task" key, so no process knows which task it is.',
            received=show(dict(decoded)), expected=f"an object such as {_EXAMPLE}",
            fix='Add "task": {"type": "worker", "index": i}, different in each process.',
        )
    return decoded


def parse_tf_config(
    value: str | Mapping[str, Any] | None = None,
) -> tuple[dict[str, tuple[str, ...]], Task]:
    """Parses and checks a TF_CONFIG; returns (role -> addresses, this process's task).

    Args:
        value: JSON text, an already decoded mapping, or None to read ``os.environ["TF_CONFIG"]``.

    Raises:
        ClusterConfigError: for any of the problems checked in `tfdist.cluster.validate`.

    Example:
        >>> parse_tf_config(_EXAMPLE)
        ({'worker': ('host:2222',)}, Task(type='worker', index=0))
    """
    config = load_tf_config(value)
    roles = check_cluster_mapping(config["cluster"], TF_CONFIG)
    task = check_task_mapping(config["task"], roles, TF_CONFIG)
    return roles, task


def make_tf_config(roles: Roles, task: Task) -> dict[str, Any]:
    """Builds the TF_CONFIG dict of ``task``: the training cluster (no evaluator) and the task.

    The caller checks the cluster and the task first (`ClusterSpec.tf_config` does).

    Example:
        >>> make_tf_config({"worker": ["h:1"], "evaluator": ["h:2"]}, Task("evaluator", 0))
        {'cluster': {'worker': ['h:1']}, 'task': {'type': 'evaluator', 'index': 0}}
    """
    cluster = {role: list(roles[role]) for role in TRAINING_ROLES if roles.get(role)}
    return {"cluster": cluster, "task": {"type": task.type, "index": task.index}}
