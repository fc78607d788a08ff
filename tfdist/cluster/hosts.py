"""Host lists (``"h1:2,h2:2"``), hostfiles, and laying tasks out on their slots.

A *slot* is room for one task on a host, as in ``horovodrun -H h1:2,h2:2``. `layout` expands the
slots host-major (h1 slot 0, h1 slot 1, h2 slot 0, ...), gives them to the tasks in canonical order
(chief, workers, ps, evaluator), and gives each task the port ``base_port + its slot on the host``.

Host names are checked by `tfdist.cluster.address.check_host` (no leading ``-``, no whitespace or
control characters); slot counts and task counts are at most `tfdist.cluster.counts.MAX_TASKS`.

Hostfiles follow OpenMPI's syntax: ``host``, ``host:slots``, ``host slots=N`` and
``host slots=N max_slots=M``. tfdist never oversubscribes a host: it places exactly ``slots``
tasks on it (1 when not given), and ``max_slots`` is only checked as a cap (``slots`` larger
than ``max_slots`` is an error). A UTF-8 byte-order mark at the start of the file is ignored.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Sequence

from tfdist.cluster._error import config_error, show
from tfdist.cluster.address import MAX_PORT, join_address, split_host_count
from tfdist.cluster.counts import MAX_TASKS, check_count, parse_count
from tfdist.cluster.roles import CHIEF, EVALUATOR, PS, WORKER
from tfdist.errors import ClusterConfigError

__all__ = [
    "HostSlots",
    "DEFAULT_BASE_PORT",
    "parse_hosts",
    "read_hostfile",
    "role_counts",
    "assign",
    "layout",
]

HostSlots = list[tuple[str, int]]
"""Hosts with their slot counts, in order: ``[("h1", 2), ("h2", 2)]``."""

DEFAULT_BASE_PORT = 2222


def _check_distinct(slots: HostSlots, where: str) -> HostSlots:
    seen: set[str] = set()
    for host, _ in slots:
        if host.lower() in seen:
            total = sum(count for other, count in slots if other.lower() == host.lower())
            raise config_error(
                where, f"host {host!r} is listed more than once.", received=show(slots),
                expected="each host once, with its slot count",
                fix=f"List it once as '{join_address(host, total)}'.",
            )
        seen.add(host.lower())
    return slots


def parse_hosts(hosts: str | Sequence[str], where: str = "host list") -> HostSlots:
    """Parses ``"h1:2,h2:2"`` (or ``["h1:2", "h2"]``) into ``[("h1", 2), ("h2", ...)]``.

    A bare host means one slot; IPv6 hosts go in brackets (``"[::1]:2"``).

    Example:
        >>> parse_hosts("h1:2,h2"), parse_hosts(["[::1]:2"])
        ([('h1', 2), ('h2', 1)], [('::1', 2)])
    """
    entries = hosts.split(",") if isinstance(hosts, str) else list(hosts)
    if not entries or not all(isinstance(entry, str) and entry.strip() for entry in entries):
        raise config_error(
            where, "it is empty or has an empty entry.", received=show(hosts),
            expected="'host:slots' entries separated by commas, e.g. 'h1:2,h2:2'",
            fix="Remove stray commas and name at least one host.",
        )
    slots = [split_host_count(entry, f"entry {entry.strip()!r}", where) for entry in entries]
    return _check_distinct(slots, where)


_HOSTFILE_OPTIONS = ("slots", "max_slots")


def _hostfile_options(
    options: Sequence[str], line: str, where: str, field: str, host: str
) -> dict[str, int]:
    """Parses the ``key=N`` options of a hostfile line into key -> N (each key at most once)."""
    values: dict[str, int] = {}
    for option in options:
        key, equals, value = option.partition("=")
        if key not in _HOSTFILE_OPTIONS or not equals:
            raise config_error(
                where, f"{field} has an unknown option {option!r}.", received=show(line),
                expected="'host', 'host:slots' or 'host slots=N [max_slots=M]'",
                fix=f"Write '{host} slots=1'.",
            )
        if key in values:
            raise config_error(
                where, f"{field} gives {key} twice.", received=show(line),
                expected=f"{key}=N at most once per line", fix=f"Keep one {key}=N.",
            )
        values[key] = parse_count(
            value, f"{key} of {field}", where, received=show(line), fix=f"Write '{host} {key}=1'."
        )
    return values


def _parse_hostfile_line(line: str, where: str, field: str) -> tuple[str, int]:
    """Parses ``host``, ``host:slots`` or ``host slots=N [max_slots=M]`` (comment removed)."""
    first, *options = line.split()
    host, count = split_host_count(first, field, where)
    values = _hostfile_options(options, line, where, field, host)
    if "slots" in values:
        if ":" in first.rpartition("]")[2]:
            raise config_error(
                where, f"{field} gives the slot count twice.", received=show(line),
                expected="either 'host:slots' or 'host slots=N'",
                fix=f"Write '{host} slots={values['slots']}'.",
            )
        count = values["slots"]
    cap = values.get("max_slots")
    if cap is not None and count > cap:
        raise config_error(
            where, f"{field} gives {count} slots, more than its max_slots={cap}.",
            received=show(line), expected="slots <= max_slots (tfdist places exactly slots tasks)",
            fix=f"Write '{host} slots={cap} max_slots={cap}', or raise max_slots.",
        )
    return host, count


def read_hostfile(path: str | os.PathLike[str]) -> HostSlots:
    """Reads a hostfile: one ``host:slots``, ``host slots=N`` or bare ``host`` per line.

    ``#`` starts a comment; blank lines are ignored. Errors name the file and the line number.
    OpenMPI's ``max_slots=M`` is accepted as a cap: ``slots`` tasks are placed on the host (never
    more), and ``slots > max_slots`` is an error. A leading UTF-8 byte-order mark is ignored.

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        ...     _ = f.write("# two machines\\nh1:2\\nh2 slots=4  # gpu box\\n")
        >>> read_hostfile(f.name)
        [('h1', 2), ('h2', 4)]
        >>> os.remove(f.name)
    """
    where = f"hostfile {os.fspath(path)!r}"
    try:
        with open(path, encoding="utf-8-sig") as file:
            lines = file.read().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise config_error(
            where, f"it cannot be read ({error}).", received=show(os.fspath(path)),
            expected="a readable text file", fix="Check the path and its permissions.",
        ) from error
    slots: HostSlots = []
    for number, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if line:
            slots.append(_parse_hostfile_line(line, where, f"line {number}"))
    if not slots:
        raise config_error(
            where, "it lists no hosts.", received="only comments or blank lines",
            expected="one 'host:slots' per line", fix="Add a line such as 'localhost:2'.",
        )
    return _check_distinct(slots, where)


def _check_base_port(base_port: object, slots: HostSlots, where: str) -> int:
    """Returns ``base_port`` if every slot's port ``base_port + slot`` is at most `MAX_PORT`."""
    if isinstance(base_port, bool) or not isinstance(base_port, int) or not (
        1 <= base_port <= MAX_PORT
    ):
        raise config_error(
            where, "base_port is not a port number.", received=f"base_port={show(base_port)}",
            expected=f"an integer in 1..{MAX_PORT}", fix=f"Use base_port={DEFAULT_BASE_PORT}.",
        )
    host, most = max(slots, key=lambda item: item[1])
    last = base_port + most - 1
    if last > MAX_PORT:
        problem = (
            f"base_port {base_port} with {most} slots on host {host!r} needs ports up to {last}, "
            f"past {MAX_PORT}."
        )
        raise config_error(
            where, problem, received=f"base_port={base_port}, {join_address(host, most)}",
            expected=f"base_port + slots - 1 <= {MAX_PORT}, so base_port <= {MAX_PORT - most + 1} "
            f"for {most} slots",
            fix=f"Use a lower base_port (e.g. {DEFAULT_BASE_PORT}), or give {host!r} fewer slots.",
        )
    return base_port


def _check_slots(slots: HostSlots, where: str) -> None:
    """Checks each host's slot count (1..MAX_TASKS), for slots not read by `parse_hosts`."""
    for host, count in slots:
        check_count(count, f"the slot count of host {host!r}", where, minimum=1)


def _too_many_workers(available: int, count: int, where: str) -> ClusterConfigError:
    return config_error(
        where, f"workers=None makes every slot left a worker: {count}, more than {MAX_TASKS} "
        "(tfdist.cluster.MAX_TASKS).", received=f"workers=None with {available} slots",
        expected=f"at most {MAX_TASKS} workers", fix=f"Pass workers= (at most {MAX_TASKS}).",
    )


def role_counts(
    available: int | None,
    *,
    workers: int | None,
    ps: int,
    chief: bool,
    evaluator: bool,
    where: str,
) -> list[tuple[str, int]]:
    """Returns (role, task count) in canonical order, checking they fit in ``available`` slots.

    ``workers=None`` means every slot left after the chief, ps and evaluator (``available`` must
    then be a number; None means unlimited).

    Example:
        >>> role_counts(4, workers=None, ps=1, chief=True, evaluator=False, where="hosts")
        [('chief', 1), ('worker', 2), ('ps', 1), ('evaluator', 0)]
    """
    if workers is not None or available is None:
        check_count(workers, "workers", where)
    check_count(ps, "ps", where)
    others = int(bool(chief)) + ps + int(bool(evaluator))
    needed = others + (workers or 0)
    if available is not None and needed > available:
        raise config_error(
            where, f"the tasks need {needed} slots but the hosts have {available}.",
            received=f"workers={workers}, ps={ps}, chief={chief}, evaluator={evaluator}",
            expected=f"at most {available} tasks in all",
            fix="Add hosts or slots (host:slots), or ask for fewer tasks.",
        )
    count = (available or 0) - others if workers is None else workers
    if count > MAX_TASKS:
        raise _too_many_workers(available or 0, count, where)
    return [(CHIEF, int(bool(chief))), (WORKER, count), (PS, ps), (EVALUATOR, int(bool(evaluator)))]


def assign(places: Sequence[str], counts: list[tuple[str, int]]) -> dict[str, tuple[str, ...]]:
    """Gives addresses to roles in order; returns role -> addresses (empty roles omitted).

    Example:
        >>> assign(["h:1", "h:2", "h:3"], [("chief", 1), ("worker", 2)])
        {'chief': ('h:1',), 'worker': ('h:2', 'h:3')}
    """
    roles: dict[str, tuple[str, ...]] = {}
    for role, count in counts:
        if count:
            roles[role], places = tuple(places[:count]), places[count:]
    return roles


def layout(
    slots: HostSlots,
    *,
    workers: int | None = None,
    ps: int = 0,
    chief: bool = False,
    evaluator: bool = False,
    base_port: int = DEFAULT_BASE_PORT,
    where: str = "host layout",
) -> dict[str, tuple[str, ...]]:
    """Lays tasks out on slots; returns role -> addresses (empty roles omitted).

    ``workers=None`` makes every slot left after the chief, ps and evaluator a worker.

    Example:
        >>> layout([("h1", 2), ("h2", 2)], ps=1, chief=True)
        {'chief': ('h1:2222',), 'worker': ('h1:2223', 'h2:2222'), 'ps': ('h2:2223',)}
    """
    if not slots:
        raise config_error(
            where, "there are no hosts to lay tasks out on.", received="[]",
            expected="at least one host with one slot", fix="Name at least one host.",
        )
    _check_slots(slots, where)
    port = _check_base_port(base_port, slots, where)
    counts = role_counts(
        sum(count for _, count in slots), workers=workers, ps=ps, chief=chief,
        evaluator=evaluator, where=where,
    )
    needed = sum(count for _, count in counts)
    return assign(list(itertools.islice(_places(slots, port), needed)), counts)


def _places(slots: HostSlots, base_port: int) -> Iterator[str]:
    """Yields the address of every slot, host-major."""
    for host, count in slots:
        for slot in range(count):
            yield join_address(host, base_port + slot)
