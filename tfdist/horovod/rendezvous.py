"""Horovod ranks started without ``horovodrun``: the Gloo rendezvous and each rank's variables.

``horovodrun --gloo`` does two things for its ranks: it serves an HTTP rendezvous where the
ranks meet, and it gives each rank ``HOROVOD_RANK``, ``HOROVOD_SIZE``, its local and cross ranks
and the rendezvous address. A runner that starts the ranks itself (`tfdist.launcher.ray.gang`)
and Slurm's srun (`tfdist.launcher.slurm.horovod`) do the same with `GlooRendezvous` and
`rank_variables`. Unlike ``horovodrun``'s, this rendezvous listens on one
address only (the one the ranks are told), not on every interface.

Ranks are assigned host-major, as ``horovodrun`` does: the ranks of one host are consecutive.

Example:
    >>> hosts = ["n1", "n1", "n2"]  # one entry per process
    >>> with GlooRendezvous.for_hosts("127.0.0.1", hosts) as rendezvous:  # doctest: +SKIP
    ...     env = rendezvous.rank_env(2, interface="eth0")
    >>> env["HOROVOD_RANK"], env["HOROVOD_CROSS_RANK"]  # doctest: +SKIP
    ('2', '1')
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from tfdist.errors import MissingDependencyError, format_error

__all__ = ["GlooRendezvous", "rank_order", "rank_variables", "slot_plan"]


def rank_order(hosts: Sequence[str]) -> list[int]:
    """Which process gets each rank: ``hosts[i]`` is process i's host; ranks go host-major.

    Returns:
        ``order[rank]`` = the index of the process that gets ``rank``.

    Example:
        >>> rank_order(["a", "b", "a"])  # a's processes get ranks 0 and 1, b's rank 2
        [0, 2, 1]
    """
    first_seen = {host: i for i, host in reversed(list(enumerate(hosts)))}
    return sorted(range(len(hosts)), key=lambda i: (first_seen[hosts[i]], i))


RENDEZVOUS_ADDR = "HOROVOD_GLOO_RENDEZVOUS_ADDR"
RENDEZVOUS_PORT = "HOROVOD_GLOO_RENDEZVOUS_PORT"


def _horovod_runner() -> tuple[Any, Any, Any, Any]:
    try:
        from horovod.runner.common.util.hosts import HostInfo, get_host_assignments
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
    except ImportError as err:
        raise MissingDependencyError(format_error(
            f"Horovod's runner is not available ({err}).",
            received="no importable horovod.runner", expected="Horovod 0.28.1 with Gloo",
            fix="build it into this environment (on every node) with `bash launch/setup.sh`",
        )) from err
    return HostInfo, get_host_assignments, RendezvousHandler, RendezvousHTTPServer


def slot_plan(host_counts: Sequence[tuple[str, int]]) -> list[Any]:
    """Horovod's ``SlotInfo`` of every rank, host-major over ``(host, processes)`` in order.

    Example:
        >>> [(s.hostname, s.local_rank) for s in slot_plan([("a", 2), ("b", 1)])]  # doctest: +SKIP
        [('a', 0), ('a', 1), ('b', 0)]
    """
    host_info, assign, _, _ = _horovod_runner()
    size = sum(count for _, count in host_counts)
    return assign([host_info(host, count) for host, count in host_counts], size, size)


def rank_variables(slot: Any, address: str, port: int | str,
                   interface: str | None) -> dict[str, str]:
    """The variables of the rank on ``slot``: its numbers, the rendezvous, Gloo's interface."""
    variables = {
        RENDEZVOUS_ADDR: address,
        RENDEZVOUS_PORT: str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_HOSTNAME": str(slot.hostname),
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
    }
    if interface:
        variables["HOROVOD_GLOO_IFACE"] = interface
    return variables


class GlooRendezvous:
    """Horovod's HTTP rendezvous on ``address`` (a free port) for the ranks of ``slots``.

    Args:
        address: The address it listens on, which every rank must reach.
        slots: Every rank's ``SlotInfo`` (`slot_plan`).
    """

    def __init__(self, address: str, slots: Sequence[Any]) -> None:
        self.address = address
        self._slots = list(slots)
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @classmethod
    def for_hosts(cls, address: str, hosts: Sequence[str]) -> GlooRendezvous:
        """For one process per entry of ``hosts`` (rank r on ``hosts[rank_order(hosts)[r]]``)."""
        counts: dict[str, int] = {}
        for host in (hosts[i] for i in rank_order(hosts)):
            counts[host] = counts.get(host, 0) + 1
        return cls(address, slot_plan(list(counts.items())))

    def start(self) -> GlooRendezvous:
        """Starts serving on a free port of `address`."""
        _, _, handler, server_class = _horovod_runner()
        self._server = server_class((self.address, 0), handler, 0)
        self._server.init(self._slots)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="gloo-rendezvous", daemon=True)
        self._thread.start()
        return self

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def rank_env(self, rank: int, interface: str) -> dict[str, str]:
        """The variables rank ``rank`` needs; ``interface``: its host's interface for Gloo."""
        return rank_variables(self._slots[rank], self.address, self.port, interface)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> GlooRendezvous:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
