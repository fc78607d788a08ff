"""Horovod ranks started without ``horovodrun``: the Gloo rendezvous and each rank's variables.

``horovodrun --gloo`` does two things for its ranks: it serves an HTTP rendezvous where the
ranks meet, and it gives each rank ``HOROVOD_RANK``, ``HOROVOD_SIZE``, its local and cross ranks
and the rendezvous address. A runner that starts the ranks itself (`tfdist.launcher.ray_runner`)
does the same with `GlooRendezvous`. Unlike ``horovodrun``'s, this rendezvous listens on one
address only (the one the ranks are told), not on every interface.

Ranks are assigned host-major, as ``horovodrun`` does: the ranks of one host are consecutive.

Example:
    >>> with GlooRendezvous("127.0.0.1", ["n1", "n1", "n2"]) as rendezvous:  # doctest: +SKIP
    ...     env = rendezvous.rank_env(2, interface="eth0")
    >>> env["HOROVOD_RANK"], env["HOROVOD_CROSS_RANK"]  # doctest: +SKIP
    ('2', '1')
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from tfdist.errors import MissingDependencyError, format_error

__all__ = ["GlooRendezvous", "rank_order"]


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


def _horovod_runner() -> tuple[Any, Any, Any, Any]:
    try:
        from horovod.runner.common.util.hosts import HostInfo, get_host_assignments
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
    except ImportError as err:
        raise MissingDependencyError(format_error(
            f"Horovod's runner is not available ({err}).",
            received="no importable horovod.runner", expected="Horovod 0.28.1 with Gloo",
            fix="build it into this environment with `bash launch/setup.sh`")) from err
    return HostInfo, get_host_assignments, RendezvousHandler, RendezvousHTTPServer


class GlooRendezvous:
    """Horovod's HTTP rendezvous for ranks on ``hosts`` (rank r on ``hosts[rank_order[r]]``).

    Args:
        address: The address it listens on, which every rank must reach.
        hosts: One entry per process: the host it runs on (any name, equal on one host).
    """

    def __init__(self, address: str, hosts: Sequence[str]) -> None:
        self.address = address
        self._hosts = list(hosts)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._slots: list[Any] = []

    def start(self) -> GlooRendezvous:
        """Starts serving on a free port of `address`."""
        host_info, assign, handler, server_class = _horovod_runner()
        counts: dict[str, int] = {}
        for host in (self._hosts[i] for i in rank_order(self._hosts)):
            counts[host] = counts.get(host, 0) + 1
        size = len(self._hosts)
        self._slots = assign([host_info(h, n) for h, n in counts.items()], size, size)
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
        slot = self._slots[rank]
        return {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": self.address,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self.port),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": interface,
            "HOROVOD_HOSTNAME": str(slot.hostname),
            "HOROVOD_RANK": str(slot.rank),
            "HOROVOD_SIZE": str(slot.size),
            "HOROVOD_LOCAL_RANK": str(slot.local_rank),
            "HOROVOD_LOCAL_SIZE": str(slot.local_size),
            "HOROVOD_CROSS_RANK": str(slot.cross_rank),
            "HOROVOD_CROSS_SIZE": str(slot.cross_size),
        }

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> GlooRendezvous:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
