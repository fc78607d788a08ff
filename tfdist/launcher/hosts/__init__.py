"""``--hosts``/``--hostfile``: a job's tasks on other machines, as local ``ssh`` processes.

* `layout`: the hosts, their slots, and which task runs where (`HostOptions`).
* `ssh`: the ``ssh`` command line of a remote task.
* `remote`: ``python -m tfdist.launcher.hosts.remote``, the remote side of such a task.

`RUNNER` is its record in `tfdist.launcher.runners`: the ``hosts`` argument group, its checks,
and the local runner's dry run and run (`tfdist.launcher.local`), which place the tasks on the
hosts. Only light modules are imported here: the CLI reads this record to build its parser.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_host_arguments(parser)
    >>> host_options(parser.parse_args(["--hosts", "n1:2,n2:2"])).base_port
    2222
"""

from __future__ import annotations

import argparse
import os

from tfdist.cluster.address import MAX_PORT
from tfdist.cluster.hosts import DEFAULT_BASE_PORT
from tfdist.launcher.hosts.layout import HostOptions
from tfdist.launcher.hosts.ssh import SshOptions
from tfdist.launcher.local import describe_placement, run_placed
from tfdist.launcher.runners import Runner, environment_default

__all__ = ["RUNNER", "add_host_arguments", "host_options", "host_problem"]


def add_host_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``hosts`` argument group (``--hosts``, ``--hostfile``, ssh's settings, ``--env``)."""
    group = parser.add_argument_group("hosts (tasks on other machines, started over ssh)")
    group.add_argument(
        "--hosts", default=environment_default("HOSTS"), metavar="H1:SLOTS,H2:SLOTS",
        help="run the tasks on these hosts, slots filled host-major: chief, workers, ps, "
        "evaluator (env TFDIST_LAUNCH_HOSTS)",
    )
    group.add_argument(
        "--hostfile", default=environment_default("HOSTFILE"), metavar="FILE",
        help="like --hosts, one 'host:slots' or 'host slots=N' per line (env "
        "TFDIST_LAUNCH_HOSTFILE)",
    )
    group.add_argument("--base-port", type=int, default=None,
                       help="TF server port of each host's first slot; the next slots take the "
                       f"next ports (default {DEFAULT_BASE_PORT})")
    group.add_argument("--ssh-port", type=int, default=environment_default("SSH_PORT"),
                       help="ssh port of the hosts (env TFDIST_LAUNCH_SSH_PORT; default: ssh's)")
    group.add_argument("--ssh-identity", default=environment_default("SSH_IDENTITY"),
                       metavar="KEY",
                       help="private key for ssh -i (env TFDIST_LAUNCH_SSH_IDENTITY)")
    group.add_argument("--ssh-known-hosts", default=environment_default("SSH_KNOWN_HOSTS"),
                       metavar="FILE", help="check the hosts' keys against this file (default: "
                       "ssh's own known hosts; env TFDIST_LAUNCH_SSH_KNOWN_HOSTS)")
    group.add_argument("--no-host-key-check", action="store_true",
                       help="accept any host key: only on a network you trust (a machine in the "
                       "middle could impersonate the hosts)")
    group.add_argument("--env", dest="env_names", action="append", default=[], metavar="NAME",
                       help="also give remote tasks (--hosts, --ray) this variable of the "
                       "launcher's environment (repeatable; never on a command line)")
    group.add_argument("--network-interface", default=environment_default("NETWORK_INTERFACE"),
                       metavar="IFACE",
                       help="horovod: the interface the ranks talk over, same name on every host "
                       "(env TFDIST_LAUNCH_NETWORK_INTERFACE; default: the one this machine "
                       "reaches the first remote host by)")


def host_options(args: argparse.Namespace) -> HostOptions | None:
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


def host_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the ``--hosts`` and ssh arguments, or None."""
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
                        ("--env", None if args.ray else args.env_names or None),
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


RUNNER = Runner(
    "hosts", describe=describe_placement, run=run_placed,
    chosen=lambda args: bool(args.hosts or args.hostfile), add_arguments=add_host_arguments,
    environment=("HOSTS", "HOSTFILE", "SSH_PORT", "SSH_IDENTITY", "SSH_KNOWN_HOSTS",
                 "NETWORK_INTERFACE"),
    options=host_options, problem=host_problem, checked_after_plan=True,
    task_group="tfdist.launcher.local.tasks:LocalTasks")
