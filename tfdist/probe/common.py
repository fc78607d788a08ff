"""What every benchmark worker shares: thread settings, timing and the loopback TCP ring.

`TcpRing` is the yardstick for collectives: every process sends ``S`` bytes to the next process
of a ring while it receives ``S`` bytes from the previous one, all at once, over loopback TCP.
That is the traffic of one step of a ring all-reduce at full speed, so ``S / t`` of the ring is
the most busbw (NCCL-tests' definition) any ring all-reduce can reach on these sockets.
"""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["RING_PORTS_ENV", "THREADS_ENV", "TcpRing", "apply_threads", "time_call", "median",
           "cpu_and_wait"]

RING_PORTS_ENV = "TFDIST_BENCH_RING_PORTS"
"""Comma-separated loopback ports of the TCP ring, one per rank."""

THREADS_ENV = "TFDIST_BENCH_THREADS"
"""``"INTER,INTRA"``: TensorFlow's inter- and intra-op thread pools (unset: TF's defaults)."""

_HOST = "127.0.0.1"


def apply_threads(environ: dict[str, str] | None = None) -> tuple[int, int] | None:
    """Sets TF's thread pools from `THREADS_ENV` (before any op runs); returns them or None."""
    value = (os.environ if environ is None else environ).get(THREADS_ENV, "")
    if not value:
        return None
    import tensorflow as tf

    inter, intra = (int(v) for v in value.split(","))
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    return inter, intra


def time_call(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` takes (wall clock)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def cpu_and_wait() -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of this process's threads so
    far, from the kernel's ``/proc/self/task/*/schedstat`` ((0, 0) where there is none).

    The difference of two readings around some work says how much the machine's other load
    (and this job's other processes) delayed it: ``(cpu + wait) / cpu`` wall seconds per CPU
    second the work needed. A thread blocked on a socket or a collective is not waiting.

    Example:
        >>> cpu, wait = cpu_and_wait()
        >>> cpu >= 0 and wait >= 0
        True
    """
    cpu = wait = 0
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return 0.0, 0.0
    for tid in threads:
        try:
            fields = Path(f"/proc/self/task/{tid}/schedstat").read_text().split()
        except OSError:
            continue  # the thread ended meanwhile
        cpu, wait = cpu + int(fields[0]), wait + int(fields[1])
    return cpu / 1e9, wait / 1e9


def median(values: Sequence[float]) -> float:
    """The median of ``values``."""
    return float(statistics.median(values))


def _connect(port: int, deadline_s: float = 60.0) -> socket.socket:
    end = time.monotonic() + deadline_s
    while True:
        try:
            sock = socket.create_connection((_HOST, port), timeout=deadline_s)
            sock.settimeout(None)
            return sock
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


class TcpRing:
    """A ring of TCP streams between ranks: rank ``r`` sends to ``r + 1`` and hears ``r - 1``.

    Args:
        rank: This process's position in ``ports``.
        ports: One loopback port per rank (each rank listens on its own).
    """

    def __init__(self, rank: int, ports: Sequence[int]) -> None:
        self.rank, self.size = rank, len(ports)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind((_HOST, ports[rank]))
        listener.listen(1)
        self._send = _connect(ports[(rank + 1) % self.size])
        self._recv, _ = listener.accept()
        listener.close()
        for sock in (self._send, self._recv):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffers: dict[int, tuple[bytearray, bytearray]] = {}

    @classmethod
    def from_env(cls, rank: int) -> TcpRing:
        """The ring whose ports `RING_PORTS_ENV` lists."""
        return cls(rank, [int(p) for p in os.environ[RING_PORTS_ENV].split(",")])

    def exchange(self, nbytes: int) -> None:
        """Sends ``nbytes`` to the next rank while receiving as many from the previous one."""
        if nbytes not in self._buffers:
            self._buffers[nbytes] = (bytearray(nbytes), bytearray(nbytes))
        out, into = self._buffers[nbytes]
        sender = threading.Thread(target=self._send.sendall, args=(out,))
        sender.start()
        view, got = memoryview(into), 0
        while got < nbytes:
            n = self._recv.recv_into(view[got:])
            if n == 0:
                raise ConnectionError(f"rank {self.rank}: the previous rank closed the ring")
            got += n
        sender.join()

    def barrier(self) -> None:
        """Returns once every rank has called it (a token passed ``size - 1`` times round)."""
        for _ in range(self.size - 1):
            self.exchange(1)

    def timed_exchange(self, nbytes: int) -> float:
        """Seconds one `exchange` of ``nbytes`` takes, all ranks starting together."""
        self.barrier()
        return time_call(lambda: self.exchange(nbytes))

    def close(self) -> None:
        self._send.close()
        self._recv.close()
