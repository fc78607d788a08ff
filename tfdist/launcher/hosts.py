"""``tfdist-launch --hosts h1:2,h2:2`` / ``--hostfile FILE``: lay a job out on several machines.

Tasks fill the hosts' slots host-major in canonical order (chief, workers, ps, evaluator; see
`ClusterSpec.from_hosts`), each on port ``--base-port`` plus its slot on that host. A task on a
host that is this machine starts directly; any other starts over ssh (`tfdist.launcher.ssh`).
Horovod jobs pass the hosts to ``horovodrun -H`` instead, which does its own ssh.

Example:
    >>> options = HostOptions(hosts="localhost:2")
    >>> spec = host_cluster(options, workers=2, strategy="multi_worker")
    >>> spec.worker, rank_hosts(options, 2)
    (('localhost:2222', 'localhost:2223'), ['localhost', 'localhost'])
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import socket
from collections.abc import Mapping, Sequence

from tfdist.cluster import ClusterSpec, parse_hosts, read_hostfile
from tfdist.cluster.address import MAX_PORT, join_address
from tfdist.cluster.hosts import DEFAULT_BASE_PORT, HostSlots
from tfdist.errors import ClusterConfigError, format_error
from tfdist.launcher.ssh import (
    SshOptions,
    env_payload,
    find_ssh,
    forwarded_env,
    is_local_host,
    ssh_command,
)

__all__ = [
    "HostOptions",
    "add_host_arguments",
    "check_host_arguments",
    "host_options_from_args",
    "host_cluster",
    "task_command",
    "rank_hosts",
    "horovodrun_host_args",
    "has_remote_host",
    "interface_towards",
]

_ENV_PREFIX = "TFDIST_LAUNCH_"


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


def _env(name: str) -> str | None:
    return os.environ.get(_ENV_PREFIX + name) or None


def add_host_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ``hosts`` argument group (``--hosts``, ``--hostfile``, ssh and port options)."""
    group = parser.add_argument_group("hosts (tasks on other machines, started over ssh)")
    group.add_argument(
        "--hosts", default=_env("HOSTS"), metavar="H1:SLOTS,H2:SLOTS",
        help="run the tasks on these hosts, slots filled host-major: chief, workers, ps, "
        "evaluator (env TFDIST_LAUNCH_HOSTS)",
    )
    group.add_argument(
        "--hostfile", default=_env("HOSTFILE"), metavar="FILE",
        help="like --hosts, one 'host:slots' or 'host slots=N' per line (env "
        "TFDIST_LAUNCH_HOSTFILE)",
    )
    group.add_argument("--base-port", type=int, default=None,
                       help="TF server port of each host's first slot; the next slots take the "
                       f"next ports (default {DEFAULT_BASE_PORT})")
    group.add_argument("--ssh-port", type=int, default=_env("SSH_PORT"),
                       help="ssh port of the hosts (env TFDIST_LAUNCH_SSH_PORT; default: ssh's)")
    group.add_argument("--ssh-identity", default=_env("SSH_IDENTITY"), metavar="KEY",
                       help="private key for ssh -i (env TFDIST_LAUNCH_SSH_IDENTITY)")
    group.add_argument("--ssh-known-hosts", default=_env("SSH_KNOWN_HOSTS"), metavar="FILE",
                       help="check the hosts' keys against this file (default: ssh's own known "
                       "hosts; env TFDIST_LAUNCH_SSH_KNOWN_HOSTS)")
    group.add_argument("--no-host-key-check", action="store_true",
                       help="accept any host key: only on a network you trust (a machine in the "
                       "middle could impersonate the hosts)")
    group.add_argument("--env", dest="env_names", action="append", default=[], metavar="NAME",
                       help="also give remote tasks (--hosts, --ray) this variable of the "
                       "launcher's environment (repeatable; never on a command line)")
    group.add_argument("--network-interface", default=_env("NETWORK_INTERFACE"), metavar="IFACE",
                       help="horovod: the interface the ranks talk over, same name on every host "
                       "(env TFDIST_LAUNCH_NETWORK_INTERFACE; default: the one this machine "
                       "reaches the first remote host by)")


def check_host_arguments(args: argparse.Namespace) -> str | None:
    """The problem with the host arguments, as a one-line message, or None."""
    for flag, value in (("--hosts", args.hosts), ("--hostfile", args.hostfile)):
        if value is not None and not value.strip():
            return (f"{flag} is empty (an unset shell variable?). Received: {flag} {value!r}. "
                    f"Fix: name the hosts, e.g. --hosts node1:2,node2:2, or drop {flag}")
    if args.hosts and args.hostfile:
        return (f"--hosts and --hostfile were both given. Received: --hosts {args.hosts!r}, "
                f"--hostfile {args.hostfile!r}. Fix: pass one of them")
    on_hosts = bool(args.hosts or args.hostfile)
    for flag, value in (("--base-port", args.base_port), ("--ssh-port", args.ssh_port),
                        ("--ssh-identity", args.ssh_identity),
                        ("--ssh-known-hosts", args.ssh_known_hosts),
                        ("--no-host-key-check", args.no_host_key_check or None),
                        ("--env", None if getattr(args, "ray", None) else args.env_names or None),
                        ("--network-interface", args.network_interface)):
        if value is not None and not on_hosts:
            return f"{flag} only applies with --hosts or --hostfile. Fix: add one, or drop {flag}"
    if args.ssh_port is not None and not 1 <= int(args.ssh_port) <= MAX_PORT:
        return f"--ssh-port must be in 1..{MAX_PORT}. Received: {args.ssh_port}"
    missing = [name for name in args.env_names if name not in os.environ]
    if missing:
        return (f"--env {missing[0]}: no such variable in the launcher's environment. Fix: export "
                f"it first, or drop --env {missing[0]}")
    if args.ssh_known_hosts is not None and not os.path.isfile(args.ssh_known_hosts):
        return (f"--ssh-known-hosts file not found. Received: {args.ssh_known_hosts!r}. "
                "Fix: pass an existing known_hosts file (ssh-keyscan -p PORT HOST >> FILE)")
    if args.ssh_identity is not None and not os.path.isfile(args.ssh_identity):
        return (f"--ssh-identity file not found. Received: {args.ssh_identity!r}. "
                "Fix: pass the path of an existing private key")
    return None


def host_options_from_args(args: argparse.Namespace) -> HostOptions | None:
    """The `HostOptions` of parsed arguments (None when no hosts were given)."""
    if not (args.hosts or args.hostfile):
        return None
    port = int(args.ssh_port) if args.ssh_port is not None else None
    return HostOptions(
        hosts=args.hosts or None, hostfile=args.hostfile or None,
        base_port=args.base_port if args.base_port is not None else DEFAULT_BASE_PORT,
        ssh=SshOptions(port=port, identity=args.ssh_identity, known_hosts=args.ssh_known_hosts,
                       check_host_keys=not args.no_host_key_check),
        network_interface=args.network_interface or None, env_names=tuple(args.env_names),
    )


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
    stdin (`tfdist.launcher.ssh.env_payload`), never on a command line.

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
