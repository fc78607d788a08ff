"""Which task this process is: read from TF_CONFIG or from Slurm's environment."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from tfdist.cluster.hosts import DEFAULT_BASE_PORT
from tfdist.cluster.roles import Task
from tfdist.cluster.slurm import slurm_host_slots, slurm_slot
from tfdist.cluster.spec import ClusterSpec
from tfdist.cluster.tf_config import TF_CONFIG, parse_tf_config
from tfdist.cluster.validate import check_strategy
from tfdist.errors import ClusterConfigError, format_error

__all__ = ["TfConfigView", "peek_tf_config", "read_tf_config", "slurm_task"]


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


def read_tf_config(
    value: str | Mapping[str, Any] | None = None, *, strategy: str | None = None
) -> tuple[ClusterSpec, Task]:
    """Parses and checks a TF_CONFIG; returns the cluster and this process's task.

    Args:
        value: JSON text, a mapping, or None to read ``os.environ["TF_CONFIG"]``.
        strategy: Also check the cluster fits this strategy (see `ClusterSpec.validate`).

    Raises:
        ClusterConfigError: with the field, the value received, what was expected and the fix.

    Example:
        >>> cluster = {"chief": ["h:1"], "worker": ["h:2"]}
        >>> spec, task = read_tf_config({"cluster": cluster, "task": {"type": "chief", "index": 0}})
        >>> spec.num_workers, str(task)
        (2, 'chief:0')
    """
    roles, task = parse_tf_config(value)
    check_strategy(roles, strategy, TF_CONFIG)
    return ClusterSpec(**roles), task


def slurm_task(
    env: Mapping[str, str] | None = None,
    *,
    ps: int = 0,
    chief: bool = False,
    evaluator: bool = False,
    base_port: int = DEFAULT_BASE_PORT,
) -> Task:
    """The task of this Slurm process in `ClusterSpec.from_slurm`'s layout.

    Pass the same layout arguments as to `ClusterSpec.from_slurm`. The task is the one on this
    process's slot (`tfdist.cluster.slurm.slurm_slot`): found from ``SLURMD_NODENAME`` and
    ``SLURM_LOCALID`` under any srun distribution, else from ``SLURM_PROCID`` (block only).

    Raises:
        ClusterConfigError: a missing or invalid variable, a slot out of range, or, without
            ``SLURMD_NODENAME``/``SLURM_LOCALID``, a distribution that is not block.

    Example:
        >>> env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}
        >>> slurm_task({**env, "SLURM_PROCID": "3"}, chief=True)
        Task(type='worker', index=2)
        >>> slurm_task({**env, "SLURMD_NODENAME": "n2", "SLURM_LOCALID": "0"}, chief=True)
        Task(type='worker', index=1)
    """
    env = os.environ if env is None else env
    spec = ClusterSpec.from_slurm(env, ps=ps, chief=chief, evaluator=evaluator, base_port=base_port)
    return spec.task_at_rank(slurm_slot(env, slurm_host_slots(env)))
