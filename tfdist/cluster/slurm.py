"""Reading the hosts and tasks of a Slurm allocation from its environment variables.

Slurm writes node lists in a compressed form (``node[01-03,07],gpu-a[1-2],login1``) and task
counts per node as ``2(x3),1`` (2 tasks on each of 3 nodes, then 1). This module expands both into
`tfdist.cluster.hosts.HostSlots`; `ClusterSpec.from_slurm` lays the tasks out on them. Node lists
of more than `tfdist.cluster.counts.MAX_TASKS` nodes, and task counts above it, are refused before
anything is expanded.

Which slot a task holds does not depend on srun's ``--distribution``: every task lays the same
slots out host-major (the node list's order, ``SLURM_TASKS_PER_NODE`` slots each), and
`slurm_slot` finds its own from the node it really runs on (``SLURMD_NODENAME``) and its index
there (``SLURM_LOCALID``), both of which srun sets on every task. So block, cyclic, plane and
arbitrary distributions all give each task its own node's address. Only where those two
variables are missing is ``SLURM_PROCID`` used as the slot, which is right for block only:
`check_block_distribution` then refuses any other ``SLURM_DISTRIBUTION``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from tfdist.cluster._error import config_error, show
from tfdist.cluster.counts import MAX_TASKS, check_count, is_whole_number, parse_count
from tfdist.cluster.hosts import HostSlots
from tfdist.cluster.roles import ROLES
from tfdist.errors import ClusterConfigError

__all__ = [
    "expand_nodelist",
    "parse_tasks_per_node",
    "slurm_host_slots",
    "slurm_rank",
    "slurm_slot",
    "check_block_distribution",
]

NODELIST_VARS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
_WHERE = "Slurm environment"
_RUN_INSIDE = "Run inside an allocation (srun or sbatch), or pass env= with the variable set."
_CHECK = "Check the value Slurm set."
_TASKS_ITEM = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")
_MAX_RANKS = len(ROLES) * MAX_TASKS  # At most MAX_TASKS tasks of each role.
_MAX_DIGITS = 18  # Longer is no node number (and int() refuses over 4300 digits).
_BLOCK_FIX = (
    "Start the tasks with srun (it sets SLURMD_NODENAME and SLURM_LOCALID, which place a task "
    "under any distribution), or with srun --distribution=block (Slurm's default)."
)


def _split_top_level(text: str) -> list[str]:
    """Splits on commas that are not inside brackets."""
    items: list[str] = []
    depth, start = 0, 0
    for position, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise config_error(
                _WHERE, "the node list has unbalanced or nested brackets.", received=show(text),
                expected="e.g. 'node[01-03,07],login1'", fix=_CHECK,
            )
        if char == "," and depth == 0:
            items.append(text[start:position])
            start = position + 1
    return items + [text[start:]]


def _check_node_count(count: int, text: str) -> None:
    """Refuses a node list of more than MAX_TASKS nodes (before it is expanded)."""
    check_count(count, "the number of nodes in the node list", _WHERE, received=show(text),
                fix=_CHECK)


def _range(part: str, body: str, text: str) -> tuple[int, int]:
    """Reads ``01-03`` (or ``07``) into ``(1, 3)``, refusing low > high and non-numbers."""
    low, dash, high = part.partition("-")
    high = high if dash else low
    numbers = all(is_whole_number(n) and len(n) <= _MAX_DIGITS for n in (low, high))
    if not numbers or int(low) > int(high):
        raise config_error(
            _WHERE, f"the node list has an invalid range [{body}].", received=show(text),
            expected="ranges like [01-03,07] with low <= high", fix=_CHECK,
        )
    return int(low), int(high)


def _expand_ranges(body: str, text: str) -> list[str]:
    """Expands ``01-03,07`` into ``['01', '02', '03', '07']``, keeping zero padding."""
    parts = body.split(",")
    ranges = [_range(part, body, text) for part in parts]
    _check_node_count(sum(high - low + 1 for low, high in ranges), text)
    return [
        str(number).zfill(len(part.partition("-")[0]))
        for part, (low, high) in zip(parts, ranges, strict=True)
        for number in range(low, high + 1)
    ]


def _expand_item(item: str, text: str) -> list[str]:
    """Expands one item (``rack[1-2]-n[1,3]``); bracket groups multiply, the first varies last."""
    names, rest = [""], item
    while (start := rest.find("[")) >= 0:
        end = rest.find("]", start)
        if end < 0:
            raise config_error(
                _WHERE, "the node list has an unclosed '['.", received=show(text),
                expected="e.g. 'node[01-03]'", fix=_CHECK,
            )
        middles = _expand_ranges(rest[start + 1 : end], text)
        _check_node_count(len(names) * len(middles), text)
        names = [name + rest[:start] + middle for name in names for middle in middles]
        rest = rest[end + 1 :]
    return [name + rest for name in names]


def expand_nodelist(text: str) -> list[str]:
    """Expands a Slurm node list; zero padding is kept and several bracket groups multiply.

    Raises:
        ClusterConfigError: a malformed list, or more than `MAX_TASKS` nodes.

    Example:
        >>> expand_nodelist("node[01-03,07],gpu-a[1-2],login1")
        ['node01', 'node02', 'node03', 'node07', 'gpu-a1', 'gpu-a2', 'login1']
    """
    nodes: list[str] = []
    for item in _split_top_level(text.strip()):
        names = _expand_item(item, text)
        _check_node_count(len(nodes) + len(names), text)
        nodes += names
    if not nodes or not all(nodes):
        raise config_error(
            _WHERE, "the node list is empty or has an empty entry.", received=show(text),
            expected="e.g. 'node[01-03],login1'", fix="Check the value Slurm set.",
        )
    return nodes


def parse_tasks_per_node(text: str, nodes: int) -> list[int]:
    """Expands ``SLURM_TASKS_PER_NODE`` (``"2(x3),1"``) into one count per node.

    Counts above `MAX_TASKS` tasks on a node, or repeats above `MAX_TASKS` nodes, are refused
    before anything is expanded.

    Example:
        >>> parse_tasks_per_node("2(x3),1", 4)
        [2, 2, 2, 1]
    """
    pairs = [_tasks_item(item, text) for item in text.strip().split(",")]
    total = check_count(
        sum(repeat for _, repeat in pairs), "the number of nodes in SLURM_TASKS_PER_NODE", _WHERE,
        received=show(text), fix=_CHECK,
    )
    if total != nodes:
        raise config_error(
            _WHERE, f"SLURM_TASKS_PER_NODE gives {total} counts for {nodes} nodes.",
            received=show(text), expected=f"one count per node of the node list ({nodes})",
            fix="Read both variables from the same allocation.",
        )
    return [count for count, repeat in pairs for _ in range(repeat)]


def _tasks_item(item: str, text: str) -> tuple[int, int]:
    """Reads one ``2(x3)`` item of SLURM_TASKS_PER_NODE into ``(2, 3)`` (count, repeat)."""
    match = _TASKS_ITEM.fullmatch(item.strip())
    if not match:
        raise config_error(
            _WHERE, f"SLURM_TASKS_PER_NODE has an invalid item {item!r}.", received=show(text),
            expected="e.g. '2(x3),1'", fix=_CHECK,
        )
    field = "SLURM_TASKS_PER_NODE"
    count = parse_count(match.group(1), f"the tasks per node in {field}", _WHERE, minimum=0,
                        received=show(text), fix=_CHECK)
    repeat = parse_count(match.group(2) or "1", f"the repeat count in {field}", _WHERE,
                         received=show(text), fix=_CHECK)
    return count, repeat


def _whole(env: Mapping[str, str], name: str, minimum: int, maximum: int = MAX_TASKS) -> int:
    """Reads a count variable (``SLURM_NTASKS``) as a whole number in ``minimum..maximum``."""
    return parse_count(env[name], name, _WHERE, minimum=minimum, maximum=maximum, fix=_CHECK)


def _missing(names: str) -> ClusterConfigError:
    return config_error(
        _WHERE, f"{names} is not set.", received="unset", expected=f"{names} set by Slurm",
        fix=_RUN_INSIDE,
    )


def _tasks_per_node(env: Mapping[str, str], nodes: int) -> list[int]:
    if "SLURM_TASKS_PER_NODE" in env:
        return parse_tasks_per_node(env["SLURM_TASKS_PER_NODE"], nodes)
    if "SLURM_NTASKS_PER_NODE" in env:
        return [_whole(env, "SLURM_NTASKS_PER_NODE", 1)] * nodes
    if "SLURM_NTASKS" in env:
        base, extra = divmod(_whole(env, "SLURM_NTASKS", 1, _MAX_RANKS), nodes)
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
    return _whole(env, "SLURM_PROCID", 0, _MAX_RANKS - 1)


def check_block_distribution(env: Mapping[str, str] | None = None) -> None:
    """Refuses a ``SLURM_DISTRIBUTION`` whose node level is not block (see the module docstring).

    Example:
        >>> check_block_distribution({"SLURM_DISTRIBUTION": "block:cyclic"})
        >>> check_block_distribution({"SLURM_DISTRIBUTION": "cyclic"})
        Traceback (most recent call last):
        ...
        tfdist.errors.ClusterConfigError: Invalid Slurm environment: SLURM_DISTRIBUTION ...
    """
    env = os.environ if env is None else env
    value = env.get("SLURM_DISTRIBUTION", "")
    node_level = value.split(",")[0].split(":")[0].strip().lower()
    if node_level in ("", "block", "*", "unknown") or is_whole_number(node_level):
        return
    raise config_error(
        _WHERE, f"SLURM_DISTRIBUTION {value!r} does not lay ranks out block-wise (node level "
        f"{node_level!r}), so the tasks would be given other nodes' addresses.",
        received=f"SLURM_DISTRIBUTION={show(value)}",
        expected="block at the node level: 'block', 'block:cyclic', ... or unset", fix=_BLOCK_FIX,
    )


def slurm_slot(env: Mapping[str, str] | None, slots: HostSlots) -> int:
    """This task's slot among ``slots`` counted host-major (see the module docstring).

    Args:
        env: Environment variables; defaults to ``os.environ``.
        slots: The allocation's nodes and task counts (`slurm_host_slots`).

    Raises:
        ClusterConfigError: ``SLURMD_NODENAME`` is not a node of the list, ``SLURM_LOCALID`` is
            beyond its node's count, or (without them) ranks that are not laid out block-wise.

    Example:
        Under ``--distribution=cyclic`` rank 1 runs on the second node, as its first task:

        >>> slots = [("n1", 2), ("n2", 2)]
        >>> slurm_slot({"SLURMD_NODENAME": "n2", "SLURM_LOCALID": "0", "SLURM_PROCID": "1"}, slots)
        2
    """
    env = os.environ if env is None else env
    node = env.get("SLURMD_NODENAME", "").strip()
    if not node or "SLURM_LOCALID" not in env:
        check_block_distribution(env)
        return slurm_rank(env)
    names = [name.lower() for name, _ in slots]
    if node.lower() not in names:
        raise config_error(
            _WHERE, f"this task's node {node!r} is not in the allocation's node list.",
            received=f"SLURMD_NODENAME={node!r}", expected=f"one of {[n for n, _ in slots]}",
            fix="Read SLURM_JOB_NODELIST and SLURMD_NODENAME in the same job step.")
    where = names.index(node.lower())
    count = slots[where][1]
    local = _whole(env, "SLURM_LOCALID", 0, _MAX_RANKS - 1)
    if local >= count:
        raise config_error(
            _WHERE, f"SLURM_LOCALID {local} is beyond the {count} task(s) of node {node!r}.",
            received=f"SLURM_LOCALID={local}, node {node!r} holding {count} slot(s)",
            expected=f"0..{count - 1}", fix=_CHECK)
    return sum(n for _, n in slots[:where]) + local
