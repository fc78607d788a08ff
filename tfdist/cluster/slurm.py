"""Reading the hosts and tasks of a Slurm allocation from its environment variables.

Slurm writes node lists in a compressed form (``node[01-03,07],gpu-a[1-2],login1``) and task
counts per node as ``2(x3),1`` (2 tasks on each of 3 nodes, then 1). This module expands both into
`tfdist.cluster.hosts.HostSlots`; `ClusterSpec.from_slurm` lays the tasks out on them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from tfdist.cluster._error import config_error, show
from tfdist.cluster.address import is_whole_number
from tfdist.cluster.hosts import HostSlots
from tfdist.errors import ClusterConfigError

__all__ = ["expand_nodelist", "parse_tasks_per_node", "slurm_host_slots", "slurm_rank"]

NODELIST_VARS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
_WHERE = "Slurm environment"
_RUN_INSIDE = "Run inside an allocation (srun or sbatch), or pass env= with the variable set."
_TASKS_ITEM = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def _split_top_level(text: str) -> list[str]:
    """Splits on commas that are not inside brackets."""
    items, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise config_error(
                _WHERE, "the node list has unbalanced or nested brackets.", received=show(text),
                expected="e.g. 'node[01-03,07],login1'", fix="Check the value Slurm set.",
            )
        if char == "," and depth == 0:
            items, current = items + [current], ""
        else:
            current += char
    return items + [current]


def _expand_ranges(body: str, text: str) -> list[str]:
    """Expands ``01-03,07`` into ``['01', '02', '03', '07']``, keeping zero padding."""
    names: list[str] = []
    for part in body.split(","):
        low, dash, high = part.partition("-")
        high = high if dash else low
        if not (is_whole_number(low) and is_whole_number(high)) or int(low) > int(high):
            raise config_error(
                _WHERE, f"the node list has an invalid range [{body}].", received=show(text),
                expected="ranges like [01-03,07] with low <= high",
                fix="Check the value Slurm set.",
            )
        names += [str(number).zfill(len(low)) for number in range(int(low), int(high) + 1)]
    return names


def _expand_item(item: str, text: str) -> list[str]:
    start = item.find("[")
    if start < 0:
        return [item]
    end = item.find("]", start)
    if end < 0:
        raise config_error(
            _WHERE, "the node list has an unclosed '['.", received=show(text),
            expected="e.g. 'node[01-03]'", fix="Check the value Slurm set.",
        )
    heads = [item[:start] + middle for middle in _expand_ranges(item[start + 1 : end], text)]
    return [head + tail for head in heads for tail in _expand_item(item[end + 1 :], text)]


def expand_nodelist(text: str) -> list[str]:
    """Expands a Slurm node list; zero padding is kept and several bracket groups multiply.

    Example:
        >>> expand_nodelist("node[01-03,07],gpu-a[1-2],login1")
        ['node01', 'node02', 'node03', 'node07', 'gpu-a1', 'gpu-a2', 'login1']
    """
    nodes = [node for item in _split_top_level(text.strip()) for node in _expand_item(item, text)]
    if not nodes or not all(nodes):
        raise config_error(
            _WHERE, "the node list is empty or has an empty entry.", received=show(text),
            expected="e.g. 'node[01-03],login1'", fix="Check the value Slurm set.",
        )
    return nodes


def parse_tasks_per_node(text: str, nodes: int) -> list[int]:
    """Expands ``SLURM_TASKS_PER_NODE`` (``"2(x3),1"``) into one count per node.

    Example:
        >>> parse_tasks_per_node("2(x3),1", 4)
        [2, 2, 2, 1]
    """
    counts: list[int] = []
    for item in text.strip().split(","):
        match = _TASKS_ITEM.fullmatch(item.strip())
        if not match:
            raise config_error(
                _WHERE, f"SLURM_TASKS_PER_NODE has an invalid item {item!r}.", received=show(text),
                expected="e.g. '2(x3),1'", fix="Check the value Slurm set.",
            )
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    if len(counts) != nodes:
        raise config_error(
            _WHERE, f"SLURM_TASKS_PER_NODE gives {len(counts)} counts for {nodes} nodes.",
            received=show(text), expected=f"one count per node of the node list ({nodes})",
            fix="Read both variables from the same allocation.",
        )
    return counts


def _whole(env: Mapping[str, str], name: str) -> int:
    value = env[name].strip()
    if not is_whole_number(value):
        raise config_error(
            _WHERE, f"{name} is not a whole number.", received=show(env[name]),
            expected="e.g. '4'", fix="Check the value Slurm set.",
        )
    return int(value)


def _missing(names: str) -> ClusterConfigError:
    return config_error(
        _WHERE, f"{names} is not set.", received="unset", expected=f"{names} set by Slurm",
        fix=_RUN_INSIDE,
    )


def _tasks_per_node(env: Mapping[str, str], nodes: int) -> list[int]:
    if "SLURM_TASKS_PER_NODE" in env:
        return parse_tasks_per_node(env["SLURM_TASKS_PER_NODE"], nodes)
    if "SLURM_NTASKS_PER_NODE" in env:
        return [_whole(env, "SLURM_NTASKS_PER_NODE")] * nodes
    if "SLURM_NTASKS" in env:
        base, extra = divmod(_whole(env, "SLURM_NTASKS"), nodes)
        return [base + 1] * extra + [base] * (nodes - extra)
    raise _missing("SLURM_TASKS_PER_NODE (or SLURM_NTASKS_PER_NODE, SLURM_NTASKS)")


def slurm_host_slots(env: Mapping[str, str] | None = None) -> HostSlots:
    """Returns the allocation's hosts with their task counts, read from ``env``.

    Args:
        env: Environment variables; defaults to ``os.environ``.

    Example:
        >>> slurm_host_slots({"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"})
        [('n1', 2), ('n2', 2)]
    """
    env = os.environ if env is None else env
    name = next((var for var in NODELIST_VARS if var in env), None)
    if name is None:
        raise _missing("SLURM_JOB_NODELIST (or SLURM_NODELIST)")
    nodes = expand_nodelist(env[name])
    counts = _tasks_per_node(env, len(nodes))
    return [(node, count) for node, count in zip(nodes, counts, strict=True) if count > 0]


def slurm_rank(env: Mapping[str, str] | None = None) -> int:
    """Returns this process's rank in the job step (``SLURM_PROCID``).

    Example:
        >>> slurm_rank({"SLURM_PROCID": "3"})
        3
    """
    env = os.environ if env is None else env
    if "SLURM_PROCID" not in env:
        raise _missing("SLURM_PROCID")
    return _whole(env, "SLURM_PROCID")
