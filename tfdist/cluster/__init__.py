"""A typed model of a TensorFlow cluster, its TF_CONFIG, and the ways to build one.

Words (see `tfdist.cluster.roles`): a **task** is one process, named ``role:index``; the roles
are **chief** (the worker that also saves; at most one), **worker**, **ps** (parameter server)
and **evaluator** (at most one, never in the cluster the others train on).

Example:
    >>> from tfdist.cluster import ClusterSpec, release_ports
    >>> spec = ClusterSpec.local(workers=2, chief=True)
    >>> [str(task) for task in spec.tasks()]
    ['chief:0', 'worker:0', 'worker:1']
    >>> spec.tf_config("worker", 1)["task"]
    {'type': 'worker', 'index': 1}
    >>> release_ports(spec.ports())
"""

from tfdist.cluster.counts import MAX_TASKS
from tfdist.cluster.environ import read_tf_config, slurm_task
from tfdist.cluster.hosts import parse_hosts, read_hostfile
from tfdist.cluster.ports import held_ports, release_ports, reserve_ports
from tfdist.cluster.roles import CHIEF, EVALUATOR, PS, ROLES, TRAINING_ROLES, WORKER, Task
from tfdist.cluster.slurm import expand_nodelist, parse_tasks_per_node
from tfdist.cluster.spec import ClusterSpec
from tfdist.cluster.tables import PaiJob, read_pai_table
from tfdist.core.environ import TF_CONFIG, TfConfigView, peek_tf_config

__all__ = [
    "CHIEF",
    "WORKER",
    "PS",
    "EVALUATOR",
    "ROLES",
    "TRAINING_ROLES",
    "TF_CONFIG",
    "MAX_TASKS",
    "Task",
    "ClusterSpec",
    "read_tf_config",
    "peek_tf_config",
    "TfConfigView",
    "slurm_task",
    "reserve_ports",
    "release_ports",
    "held_ports",
    "parse_hosts",
    "read_hostfile",
    "expand_nodelist",
    "parse_tasks_per_node",
    "PaiJob",
    "read_pai_table",
]
