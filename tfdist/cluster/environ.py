"""Which task this process is: read from TF_CONFIG or from Slurm's environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from tfdist.cluster.hosts import DEFAULT_BASE_PORT
from tfdist.cluster.roles import Task
from tfdist.cluster.slurm import slurm_host_slots, slurm_slot
from tfdist.cluster.spec import ClusterSpec
from tfdist.cluster.strategy import check_fits
from tfdist.cluster.tf_config import parse_tf_config
from tfdist.core.environ import TF_CONFIG

__all__ = ["read_tf_config", "slurm_task"]


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
    check_fits(roles, strategy, TF_CONFIG)
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
