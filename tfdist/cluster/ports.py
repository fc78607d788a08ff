"""Reserving free TCP ports for the tasks of a local cluster, without a race.

The usual trick, "bind port 0, read the port, close the socket", has a window: between the close
and the moment the task's server binds, any other process (or another builder in this one) can be
handed the same port by the kernel. `reserve_ports` closes that window by keeping the socket.

How it works:

1. For each port, a TCP socket with ``SO_REUSEADDR`` and ``SO_REUSEPORT`` set is bound to port 0
   on ``host``; the kernel picks a free port. The socket never calls ``listen()``.
2. The socket stays open in a module-level registry (guarded by a lock) until
   `release_ports` closes it, or the process exits.

While it is held (Linux semantics):

* the kernel never gives the port to another ``bind(("", 0))``, in this or any other process,
  because an automatic bind skips every port that has a bound socket; nor does it pick the port
  as the source port of an outgoing connection (connect's automatic port choice skips ports that
  were bound explicitly). So two builders never hand out the same port, and nothing can take the
  port between its reservation and its use;
* the task that is given the port can still bind it and listen on it: TensorFlow's gRPC server
  sets ``SO_REUSEADDR`` on its listening socket, and two sockets that both set ``SO_REUSEADDR``
  may share a port as long as at most one of them listens. (TF's gRPC server does **not** set
  ``SO_REUSEPORT``; measured with TF 2.21: holding a socket with only ``SO_REUSEPORT`` makes
  ``tf.distribute.Server`` fail with "Could not start gRPC server", holding one with
  ``SO_REUSEADDR`` does not. ``SO_REUSEPORT`` is set here as well so that servers which use it
  instead can bind too.) ``tests/unit/test_cluster_ports.py`` checks this with a real server.

A process that binds the port explicitly *without* ``SO_REUSEADDR`` gets "address already in use"
while it is held: release ports whose tasks are not gRPC servers before handing them over.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable

from tfdist.cluster._error import config_error, show
from tfdist.cluster.address import MAX_PORT
from tfdist.cluster.counts import check_count

__all__ = ["reserve_ports", "release_ports", "held_ports"]

_lock = threading.Lock()
_held: dict[int, list[socket.socket]] = {}  # A port can be held on several hosts.


def _bind_free_port(host: str) -> socket.socket:
    """Returns a bound, non-listening socket on a kernel-chosen free port of ``host``."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):  # Absent on Windows.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host.strip("[]"), 0))
    except OSError:
        sock.close()
        raise
    return sock


def reserve_ports(n: int, host: str = "localhost") -> list[int]:
    """Reserves ``n`` distinct free TCP ports on ``host`` and holds them until released.

    See the module docstring for why a held port is still bindable by the TensorFlow server
    that it is given to, and by nothing else that asks the kernel for a free port.

    Args:
        n: How many ports (>= 0).
        host: The local address to reserve on; ``"localhost"`` binds 127.0.0.1.

    Returns:
        The ports, in the order reserved.

    Raises:
        ClusterConfigError: if ``n`` is not in 0..65535 or ``host`` cannot be bound.

    Example:
        >>> ports = reserve_ports(2)
        >>> len(set(ports)) == 2 and set(ports) <= set(held_ports())
        True
        >>> release_ports(ports)
    """
    check_count(n, "n", "port request", maximum=MAX_PORT, fix="Pass how many ports you need.")
    sockets: list[socket.socket] = []
    try:
        for _ in range(n):
            sockets.append(_bind_free_port(host))
    except OSError as error:
        for sock in sockets:
            sock.close()
        raise config_error(
            "port request", f"cannot bind a free port on host {host!r} ({error}).",
            received=show(host), expected="an address of this machine",
            fix='Use host="localhost" or one of this machine\'s IP addresses.',
        ) from error
    ports = [sock.getsockname()[1] for sock in sockets]
    with _lock:
        for port, sock in zip(ports, sockets, strict=True):
            _held.setdefault(port, []).append(sock)
    return ports


def release_ports(ports: Iterable[int]) -> None:
    """Closes the reservations of ``ports``; ports that are not held are ignored.

    Example:
        >>> ports = reserve_ports(1)
        >>> release_ports(ports)
        >>> ports[0] in held_ports()
        False
    """
    with _lock:
        sockets = [sock for port in set(ports) for sock in _held.pop(port, [])]
    for sock in sockets:
        sock.close()


def held_ports() -> list[int]:
    """Returns the ports this process holds, sorted.

    Example:
        >>> isinstance(held_ports(), list)
        True
    """
    with _lock:
        return sorted(_held)
