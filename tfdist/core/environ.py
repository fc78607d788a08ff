"""TF_CONFIG as this process's environment gives it, read without validating it.

Detection (`tfdist.core.detect`), the evaluator and the Horovod checks only need to look (which
task am I, how many ps are there); `tfdist.cluster.read_tf_config` checks everything and is what
strategies use.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping

from tfdist.errors import ClusterConfigError, format_error

__all__ = ["TF_CONFIG", "TfConfigView", "peek_tf_config"]

TF_CONFIG = "TF_CONFIG"
"""The environment variable TensorFlow reads a task's cluster and identity from."""


@dataclasses.dataclass(frozen=True)
class TfConfigView:
    """TF_CONFIG as written, before validation: role -> addresses, and the task's type/index.

    Example:
        >>> TfConfigView({"worker": ["h:1", "h:2"]}, "worker", 1).count("worker")
        2
    """

    roles: dict[str, list[str]]
    task_type: str
    task_index: int

    def count(self, role: str) -> int:
        """How many ``role`` tasks TF_CONFIG lists."""
        return len(self.roles.get(role, ()))


def peek_tf_config(environ: Mapping[str, str] | None = None) -> TfConfigView | None:
    """This process's TF_CONFIG without validating it (None when unset or blank).

    For code that only needs to look (which task am I, how many ps are there); `read_tf_config`
    checks everything and is what strategies use.

    Raises:
        ClusterConfigError: TF_CONFIG is not a JSON object with a ``cluster`` mapping.

    Example:
        >>> view = peek_tf_config({"TF_CONFIG": '{"cluster": {"ps": ["h:1"]}, '
        ...                        '"task": {"type": "ps", "index": 0}}'})
        >>> view.count("ps"), view.task_type
        (1, 'ps')
        >>> peek_tf_config({}) is None
        True
    """
    env = os.environ if environ is None else environ
    text = env.get(TF_CONFIG, "").strip()
    if not text:
        return None
    try:
        config = json.loads(text)
        cluster = config.get("cluster") or {}
        task = config.get("task") or {}
        roles = {str(role): list(cluster.get(role) or []) for role in cluster}
        return TfConfigView(roles, str(task.get("type", "")), int(task.get("index", 0)))
    except (ValueError, AttributeError, TypeError, RecursionError) as err:
        raise ClusterConfigError(
            format_error("TF_CONFIG is not a JSON object with a 'cluster' mapping.",
                         received=repr(text[:80]),
                         expected='{"cluster": {"worker": [...]}, "task": {...}}',
                         fix="fix TF_CONFIG, or unset it to train on this host alone")
        ) from err
