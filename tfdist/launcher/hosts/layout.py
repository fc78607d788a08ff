"""``tfdist-launch --hosts h1:2,h2:2`` / ``--hostfile FILE``: lay a job out on several machines.

Tasks fill the hosts' slots host-major in canonical order (chief, workers, ps, evaluator; see
`ClusterSpec.from_hosts`), each on port ``--base-port`` plus its slot on that host. A task on a
host that is this machine starts directly; any other starts over ssh (`tfdist.launcher.hosts.ssh`).
Horovod jobs pass the hosts to ``horovodrun -H`` instead, which does its own ssh.

Example:
    >>> options = HostOptions(hosts="localhost:2")
    >>> spec = host_cluster(options, workers=2, strategy="multi_worker")
    >>> spec.worker, rank_hosts(options, 2)
    (('localhost:2222', 'localhost:2223'), ['localhost', 'localhost'])
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
from collections.abc import Mapping, Sequence

from tfdist.cluster import ClusterSpec, parse_hosts, read_hostfile
from tfdist.cluster.address import join_address
from tfdist.cluster.hosts import DEFAULT_BASE_PORT, HostSlots
from tfdist.errors import ClusterConfigError, format_error
from tfdist.launcher.hosts.ssh import (
    SshOptions,
    env_payload,
    find_ssh,
    forwarded_env,
    is_local_host,
    ssh_command,
)

__all__ = [
    "HostOptions",
    "host_cluster",
    "task_command",
    "rank_hosts",
    "horovodrun_host_args",
    "has_remote_host",
    "interface_towards",
]


@dataclasses.dataclass(frozen=True)
class HostOptions:
    """Where a job's tasks run: a host list or a hostfile, the TF base port, and ssh settings.

    Attributes:
        hosts: ``"h1:2,h2:2"`` (None: use ``hostfile``).
        hostfile: A file of ``host:slots`` / ``host slots=N`` lines (None: use ``hosts``).
        base_port: The TF server port of each host's first slot.
        ssh: Port and identity for ssh.
        network_interface: The interface Horovod's ranks talk over (``horovodrun
            --network-interfaces``); None: the one this machine reaches the first remote host by.
        env_names: Variables of this environment remote tasks get too (``--env NAME``).

    Example:
        >>> HostOptions(hosts="h1:2,h2:2").slots()
        [('h1', 2), ('h2', 2)]
    """

    hosts: str | None = None
    hostfile: str | None = None
    base_port: int = DEFAULT_BASE_PORT
    ssh: SshOptions = SshOptions()
    network_interface: str | None = None
    env_names: tuple[str, ...] = ()

    def slots(self) -> HostSlots:
        """The hosts and their slot counts (reads the hostfile; raises `ClusterConfigError`)."""
        if self.hostfile is not None:
            return read_hostfile(self.hostfile)
        return parse_hosts(self.hosts or "")

    def host_list(self) -> str:
        """The hosts as ``"h1:2,h2:2"`` (a hostfile converted), e.g. for ``horovodrun -H``."""
        return ",".join(join_address(host, count) for host, count in self.slots())


def host_cluster(
    options: HostOptions,
    *,
    workers: int,
    ps: int = 0,
    chief: bool = False,
    evaluator: bool = False,
    strategy: str | None = None,
) -> ClusterSpec:
    """The cluster laid out on the hosts (raises `ClusterConfigError` if it does not fit)."""
    slots = options.slots()
    _check_reachable(slots)
    hosts = [join_address(host, count) for host, count in slots]
    spec = ClusterSpec.from_hosts(
        hosts, workers=workers, ps=ps, chief=chief, evaluator=evaluator,
        base_port=options.base_port, strategy=strategy,
    )
    _check_local_ports_free(spec)
    return spec


def _check_local_ports_free(spec: ClusterSpec) -> None:
    """Refuses a port of this machine that something already listens on (before: TensorFlow's
    traceback half a minute after start). Other machines' ports are checked by their tasks."""
    for task in spec.tasks():
        host = spec.host(task)
        if not is_local_host(host):
            continue
        port = int(spec.address(task).rsplit(":", 1)[1])
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TF's server does
            try:
                sock.bind(("", port))
            except OSError as err:
                raise ClusterConfigError(format_error(
                    f"Port {port} of task {task} on {host} is already in use ({err.strerror}).",
                    received=f"--base-port {spec_base_port(spec)} -> {task} at "
                    f"{spec.address(task)}",
                    expected="free ports from the base port up, one per slot of each host",
                    fix=f"pass another --base-port, or stop what listens on {port} "
                    f"(see: ss -ltnp 'sport = :{port}')",
                )) from err


def spec_base_port(spec: ClusterSpec) -> int:
    """The lowest port of ``spec`` (the base port of a `from_hosts` layout)."""
    return min(int(spec.address(task).rsplit(":", 1)[1]) for task in spec.tasks())


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower() in ("localhost", "localhost.localdomain", "ip6-localhost")


def _check_reachable(slots: HostSlots) -> None:
    """Refuses ``localhost`` beside other machines: their tasks could not reach it by that name."""
    loopback = [host for host, _ in slots if _is_loopback(host)]
    if loopback and not all(is_local_host(host) for host, _ in slots):
        raise ClusterConfigError(format_error(
            f"Host {loopback[0]!r} is a loopback name, but other hosts are listed: their tasks "
            "would connect to themselves, not to this machine.",
            received=", ".join(join_address(host, count) for host, count in slots),
            expected="every host named by an address all hosts can reach",
            fix="Name this machine by its hostname or network address instead",
        ))


def task_command(
    options: HostOptions, host: str, argv: Sequence[str], env: Mapping[str, str]
) -> tuple[tuple[str, ...], str | None]:
    """How to start a task on ``host``: its argv, and what to write on its stdin.

    A host that is this machine runs ``argv`` itself (``env`` is set by the process group). Any
    other runs the ssh command, and gets ``env`` plus the forwarded variables as a JSON line on
    stdin (`tfdist.launcher.hosts.ssh.env_payload`), never on a command line.

    Example:
        >>> task_command(HostOptions(hosts="localhost:1"), "localhost", ["python", "t.py"], {})
        (('python', 't.py'), None)
    """
    if is_local_host(host):
        return tuple(argv), None
    payload = env_payload({**forwarded_env(names=options.env_names), **env})
    return ssh_command(host, argv, options.ssh), payload


def rank_hosts(options: HostOptions, ranks: int, strategy: str | None = None) -> list[str]:
    """The host of each Horovod rank (``horovodrun`` fills hosts in order, like `from_hosts`).

    Example:
        >>> rank_hosts(HostOptions(hosts="h1:2,h2:2"), 3)
        ['h1', 'h1', 'h2']
    """
    spec = host_cluster(options, workers=ranks, strategy=strategy)
    return [spec.host(task) for task in spec.tasks()]


def horovodrun_host_args(options: HostOptions) -> tuple[str, ...]:
    """``-H h1:2,h2:2`` plus ``-p``/``--ssh-identity-file``/``--network-interfaces``.

    With a remote host, the ranks' network interface is named (`HostOptions.network_interface`,
    else `interface_towards` the first remote host): horovodrun then skips its own interface
    probe, which can pick ``lo`` (so Gloo connects to 127.0.0.1) when every host has one.

    Raises:
        ClusterConfigError: A host is another machine and ssh is not installed.

    Example:
        >>> horovodrun_host_args(HostOptions(hosts="localhost:2", ssh=SshOptions(port=2022)))
        ('-H', 'localhost:2', '-p', '2022')
    """
    remote = [host for host, _ in options.slots() if not is_local_host(host)]
    if remote:
        find_ssh()  # horovodrun starts remote ranks with ssh
    ssh = options.ssh
    port = ("-p", str(ssh.port)) if ssh.port is not None else ()
    identity = ("--ssh-identity-file", ssh.identity) if ssh.identity is not None else ()
    nic = options.network_interface or (interface_towards(remote[0]) if remote else None)
    nics = ("--network-interfaces", nic) if nic else ()
    return ("-H", options.host_list(), *port, *identity, *nics)


def has_remote_host(options: HostOptions) -> bool:
    """Whether a host of ``options`` is another machine (reached over ssh)."""
    return not all(is_local_host(host) for host, _ in options.slots())


def interface_towards(host: str) -> str | None:
    """The name of this machine's interface that routes to ``host`` (None if unknown).

    Asks the kernel for the route (a UDP ``connect`` sends nothing), then finds the interface
    holding that source address with ``psutil`` (a Horovod dependency).

    Example:
        >>> interface_towards("127.0.0.1") in ("lo", None)
        True
    """
    try:
        import psutil

        address = socket.getaddrinfo(host.strip("[]"), None, socket.AF_INET)[0][4][0]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((address, 9))
            source = sock.getsockname()[0]
    except (ImportError, OSError):
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == source for a in addresses):
            return name
    return None
