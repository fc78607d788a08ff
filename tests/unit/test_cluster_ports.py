"""Port reservation: a held port is never handed out twice, yet TensorFlow's server binds it."""

from __future__ import annotations

import errno
import os
import queue
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

from tfdist.cluster import ClusterSpec, held_ports, release_ports, reserve_ports
from tfdist.errors import ClusterConfigError

pytestmark = pytest.mark.unit

TF_SERVER_TIMEOUT_S = 120


@pytest.fixture
def ports() -> Iterator[list[int]]:
    """A list to put reserved ports in; they are released after the test."""
    reserved: list[int] = []
    yield reserved
    release_ports(reserved)


def plain_bind(port: int) -> None:
    """Binds like a program that sets no socket options (the usual server or client)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))


def test_fifty_reservations_never_repeat_a_port(ports: list[int]) -> None:
    for _ in range(50):
        ports += reserve_ports(1)
    assert len(set(ports)) == 50
    assert set(ports) <= set(held_ports())


def test_successive_local_clusters_never_share_a_port(ports: list[int]) -> None:
    first = ClusterSpec.local(workers=3, ps=2, chief=True, evaluator=True)
    ports += first.ports()
    second = ClusterSpec.local(workers=3, ps=2, chief=True, evaluator=True)
    ports += second.ports()
    assert len(set(first.ports()) | set(second.ports())) == 14


def test_a_held_port_refuses_plain_binds_until_released(ports: list[int]) -> None:
    ports += reserve_ports(3)
    for port in ports:
        with pytest.raises(OSError) as info:
            plain_bind(port)
        assert info.value.errno == errno.EADDRINUSE
    release_ports(ports)
    assert not set(ports) & set(held_ports())
    for port in ports:
        plain_bind(port)  # Free again: nothing listened, so nothing lingers in TIME_WAIT.


def test_another_process_asking_for_free_ports_never_gets_a_held_one(ports: list[int]) -> None:
    ports += reserve_ports(200)
    child = textwrap.dedent(
        """
        import socket
        socks = []
        for host in ["127.0.0.1", "0.0.0.0"] * 100:
            sock = socket.socket()
            sock.bind((host, 0))
            socks.append(sock)
        print(" ".join(str(s.getsockname()[1]) for s in socks))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=60, check=True
    )
    theirs = {int(port) for port in result.stdout.split()}
    assert len(theirs) == 200 and not theirs & set(ports)


def test_release_is_idempotent_and_bad_requests_are_refused() -> None:
    release_ports([1, 2, 3])  # Not held: ignored.
    with pytest.raises(ClusterConfigError, match=r"n must be an integer >= 0.*Received: n=-1"):
        reserve_ports(-1)
    with pytest.raises(ClusterConfigError, match=r"cannot bind a free port on host '192.0.2.1'"):
        reserve_ports(1, host="192.0.2.1")  # TEST-NET-1: never an address of this machine.
    assert reserve_ports(0) == []


TF_SERVER = textwrap.dedent(
    """
    import sys
    import tensorflow as tf

    def serve(port):
        cluster = tf.train.ClusterSpec({"worker": [f"localhost:{port}"]})
        return tf.distribute.Server(cluster, job_name="worker", task_index=0, protocol="grpc",
                                    start=True)

    try:  # Control: a port held by a *listening* socket cannot be bound, so the check can fail.
        serve(int(sys.argv[2]))
        print("control bound", flush=True)
    except tf.errors.UnknownError:
        print("control refused", flush=True)
    server = serve(int(sys.argv[1]))
    with tf.Graph().as_default():
        total = tf.constant(20) + tf.constant(22)
        with tf.compat.v1.Session(server.target) as session:  # A real gRPC round trip.
            print("result", session.run(total), flush=True)
    print("ready", flush=True)
    sys.stdin.read()  # Serve until the test closes our stdin.
    """
)


def read_until_ready(process: subprocess.Popen[str], timeout_s: float) -> list[str]:
    """Returns the child's stdout lines up to "ready"; fails with its output otherwise."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        with process.stdout:  # type: ignore[union-attr]
            for line in process.stdout:  # type: ignore[union-attr]
                lines.put(line.strip())
        lines.put(None)  # End of output: the child exited.

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while not seen or seen[-1] != "ready":
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.001))
        except queue.Empty:
            pytest.fail(f"TF server did not start within {timeout_s}s; output: {seen}")
        if line is None:
            pytest.fail(f"TF server exited ({process.wait()}); output: {seen}")
        seen.append(line)
    return seen


@pytest.mark.slow  # seconds of training, a TF process or waiting: make test, not test-fast
def test_tensorflow_server_binds_and_serves_a_held_port(ports: list[int]) -> None:
    ports += reserve_ports(1)
    listening = socket.create_server(("127.0.0.1", 0))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    argv = [sys.executable, "-c", TF_SERVER, str(ports[0]), str(listening.getsockname()[1])]
    process = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=env,
    )
    try:
        lines = read_until_ready(process, TF_SERVER_TIMEOUT_S)
        assert lines == ["control refused", "result 42", "ready"]
        assert ports[0] in held_ports()  # Still reserved while TF serves on it.
        with socket.create_connection(("localhost", ports[0]), timeout=10):
            pass  # Another process reaches the TF server on the held port.
    finally:
        listening.close()
        process.stdin.close()  # type: ignore[union-attr]
        process.terminate()
        process.wait(timeout=30)
