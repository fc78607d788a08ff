"""A private network for a local job: its tasks share a network namespace that has only loopback.

TensorFlow's gRPC server listens on every interface whatever address its TF_CONFIG names, and
runs any graph a client sends, unauthenticated (TensorFlow's SECURITY.md: trusted networks only);
``horovodrun``'s rendezvous binds ``0.0.0.0``. A job whose tasks all run on this machine needs no
network but loopback, so `tfdist-launch` starts them inside one new network namespace holding
only ``lo``: nothing they listen on can be reached from outside the job, not even from this
machine's own non-loopback address. Outbound network is gone too (a script that reads from
cloud storage needs ``--network host``).

How: a small holder process (``python -m tfdist.launcher.local.netns [ADDRESS...]``) calls
``unshare(CLONE_NEWNET)``, brings ``lo`` up, adds the extra loopback addresses the job asked for
(an elastic Horovod job names each slot by its own, `tfdist.launcher.horovodrun.elastic`) and
waits; each task joins its namespace (``setns``) between fork and exec. The namespace disappears
with the last of them. This needs ``CAP_SYS_ADMIN`` (root, as in containers and CI); where it is
missing, `PrivateNetwork.start` raises `NetworkIsolationError` and the launcher says so and runs
the job on the host network.

Example:
    >>> with PrivateNetwork() as net:  # doctest: +SKIP
    ...     subprocess.run(["ip", "-o", "link"], preexec_fn=net.join)  # only "lo"
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import subprocess
import sys
from typing import IO

from tfdist.errors import LaunchError

__all__ = ["PrivateNetwork", "NetworkIsolationError", "CLONE_NEWNET"]

CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_READY = "ready"
_RTM_NEWADDR, _NLMSG_ERROR, _IFA_ADDRESS, _IFA_LOCAL, _RT_SCOPE_HOST = 20, 2, 1, 2, 254
_NLM_F_REQUEST_ACK_CREATE = 0x1 | 0x4 | 0x400
_START_TIMEOUT = 10.0


class NetworkIsolationError(LaunchError):
    """This machine does not let tfdist create a private network namespace (needs root)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL("libc.so.6", use_errno=True)


def _loopback_up() -> None:
    """Sets ``lo`` up in this process's network namespace (a new one starts with it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def _add_loopback_address(address: str) -> None:
    """Adds ``address``/32 to ``lo`` (netlink ``RTM_NEWADDR``, what ``ip addr add`` sends).

    Raises:
        OSError: The kernel refused, with its errno.
    """
    packed = socket.inet_aton(address)
    attrs = b"".join(struct.pack("HH", 4 + len(packed), kind) + packed
                     for kind in (_IFA_LOCAL, _IFA_ADDRESS))
    body = struct.pack("BBBBI", socket.AF_INET, 32, 0, _RT_SCOPE_HOST,
                       socket.if_nametoindex("lo")) + attrs
    message = struct.pack("IHHII", 16 + len(body), _RTM_NEWADDR, _NLM_F_REQUEST_ACK_CREATE,
                          1, 0) + body
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.sendto(message, (0, 0))
        reply = sock.recv(4096)
    kind = struct.unpack_from("H", reply, 4)[0]
    error = -struct.unpack_from("i", reply, 16)[0] if kind == _NLMSG_ERROR else 0
    if error:
        raise OSError(error, f"cannot add {address} to lo: {os.strerror(error)}")


def hold(addresses: list[str]) -> int:
    """The holder process: a new network namespace with ``lo`` up (and ``addresses`` on it),
    kept until stdin closes."""
    if _libc().unshare(CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        print(f"unshare(CLONE_NEWNET) failed: {os.strerror(errno)}", flush=True)
        return 1
    _loopback_up()
    try:
        for address in addresses:
            _add_loopback_address(address)
    except OSError as err:
        print(str(err), flush=True)
        return 1
    print(_READY, flush=True)
    sys.stdin.read()  # the launcher holds the other end; EOF when it exits or dies
    return 0


class PrivateNetwork:
    """A network namespace with only loopback that tasks join between fork and exec.

    Use as a context manager; pass `join` as (part of) a child's ``preexec_fn``.

    Args:
        addresses: Extra loopback addresses (``127.0.1.1``) for ``lo`` in the namespace.
    """

    def __init__(self, addresses: tuple[str, ...] = ()) -> None:
        self._addresses = addresses
        self._holder: subprocess.Popen[str] | None = None
        self.path: str | None = None

    def start(self) -> PrivateNetwork:
        """Creates the namespace.

        Raises:
            NetworkIsolationError: The kernel refused (no ``CAP_SYS_ADMIN``), with the reason.
        """
        from tfdist.launcher.process import _die_with_parent

        holder = subprocess.Popen(
            [sys.executable, "-m", "tfdist.launcher.local.netns", *self._addresses],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=_die_with_parent,
        )
        line = _read_line(holder.stdout, _START_TIMEOUT)
        if line != _READY:
            holder.kill()
            holder.wait()
            raise NetworkIsolationError(
                f"cannot create a private network namespace: {line or 'no answer'}")
        self._holder = holder
        self.path = f"/proc/{holder.pid}/ns/net"
        return self

    def join(self) -> None:  # pragma: no cover - runs in the child between fork and exec
        """Moves the calling process into the namespace (call it in a child's preexec_fn)."""
        if self.path is None:
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            if _libc().setns(fd, CLONE_NEWNET) != 0:
                os._exit(126)  # never run a task on the host network by accident
        finally:
            os.close(fd)

    def close(self) -> None:
        """Lets the holder go; the namespace ends with the last task in it."""
        if self._holder is not None:
            if self._holder.stdin:
                self._holder.stdin.close()
            try:
                self._holder.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._holder.kill()
                self._holder.wait()
            self._holder = None

    def __enter__(self) -> PrivateNetwork:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _read_line(stream: IO[str] | None, timeout: float) -> str:
    import selectors

    if stream is None:
        return ""
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        if not selector.select(timeout):
            return ""
    return stream.readline().strip()


if __name__ == "__main__":
    sys.exit(hold(sys.argv[1:]))
