"""Start a task on another host: the ``ssh`` command line for one task of a `JobPlan`.

A remote task runs the same Python, in the same working directory, under
`tfdist.launcher.hosts.remote`, which stops the task when the ssh connection closes (killing a local
``ssh`` client alone would leave the remote process running)::

    ssh -o BatchMode=yes -o StrictHostKeyChecking=yes ... [-p PORT] [-i KEY] HOST \\
        'cd /work && exec /venv/bin/python -m tfdist.launcher.hosts.remote --env-stdin -- ARGV'

Its environment (TF_CONFIG and the rest) is sent as one JSON line on the ssh channel's stdin
(`env_payload`), never on a command line, where ``ps`` would show it on both machines. Only what
tfdist sets for the task, a few runtime variables (`FORWARDED_ENV`), ``TFDIST_*`` settings and the
variables the user names (``--env NAME``) are sent. Host keys are checked (``StrictHostKeyChecking
=yes``, against the user's known hosts or ``--ssh-known-hosts``) unless ``--no-host-key-check``.

Hosts that are this machine (``localhost``, a loopback address, this machine's hostname, or an IP
address bound to one of its interfaces) run their tasks without ssh.

Example:
    >>> options = SshOptions(port=2022, identity="/keys/id")
    >>> argv = ssh_command("n2", ["python", "t.py"], options, cwd="/w", ssh="ssh")
    >>> argv[-2], argv[-1].endswith(" -m tfdist.launcher.hosts.remote --env-stdin -- python t.py")
    ('n2', True)
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import re
import shlex
import shutil
import socket
import sys
from collections.abc import Mapping, Sequence

from tfdist.errors import ClusterConfigError, format_error

__all__ = [
    "SshOptions",
    "FORWARDED_ENV",
    "FORWARDED_ENV_PREFIXES",
    "is_local_host",
    "forwarded_env",
    "remote_shell_command",
    "env_payload",
    "ssh_command",
    "find_ssh",
]

# Options that make ssh fail instead of prompting.
SSH_OPTIONS = (
    "-o", "BatchMode=yes",
    "-o", "LogLevel=ERROR",
)
# Variables of the launcher's environment that remote tasks also get (besides each task's own):
# how to find and run Python code, never credentials. Anything else: --env NAME.
FORWARDED_ENV = ("PYTHONPATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")
FORWARDED_ENV_PREFIXES = ("TFDIST_",)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


@dataclasses.dataclass(frozen=True)
class SshOptions:
    """How to reach remote hosts.

    Attributes:
        port: The ssh port (None: ssh's default, usually 22).
        identity: A private key file for ``ssh -i`` (None: ssh's defaults).
        known_hosts: The known-hosts file to check host keys against (None: ssh's default).
        check_host_keys: False accepts any host key (``--no-host-key-check``): only on a network
            you trust, as it lets a machine in the middle impersonate the hosts.

    Example:
        >>> SshOptions(port=2022).args()
        ('-o', 'StrictHostKeyChecking=yes', '-p', '2022')
    """

    port: int | None = None
    identity: str | None = None
    known_hosts: str | None = None
    check_host_keys: bool = True

    def args(self) -> tuple[str, ...]:
        """The host-key, ``-p`` and ``-i`` arguments of the ssh command line."""
        if self.check_host_keys:
            keys: tuple[str, ...] = ("-o", "StrictHostKeyChecking=yes")
            if self.known_hosts is not None:
                keys += ("-o", f"UserKnownHostsFile={self.known_hosts}")
        else:
            keys = ("-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null")
        port = ("-p", str(self.port)) if self.port is not None else ()
        identity = ("-i", self.identity) if self.identity is not None else ()
        return (*keys, *port, *identity)


def is_local_host(host: str) -> bool:
    """Whether ``host`` is this machine, so its tasks can start without ssh.

    Names are compared without DNS (``localhost``, this machine's hostname); an IP address is
    local when it is a loopback address or can be bound here (it belongs to one of this network
    namespace's interfaces).

    Example:
        >>> is_local_host("localhost"), is_local_host("127.0.0.2"), is_local_host("198.51.100.7")
        (True, True, False)
    """
    name = host.strip("[]").lower()
    if name in _LOCAL_NAMES or name == socket.gethostname().lower():
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if address.is_loopback:
        return True
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((name, 0))
        except OSError:
            return False
    return True


def forwarded_env(
    environ: Mapping[str, str] | None = None, names: Sequence[str] = ()
) -> dict[str, str]:
    """The variables of ``environ`` (default ``os.environ``) that remote tasks get too.

    Those in `FORWARDED_ENV`, those starting with one of `FORWARDED_ENV_PREFIXES`, and ``names``
    (``--env NAME``); ``PATH``, ``HOME``, credentials and the rest stay here.

    Example:
        >>> env = {"PYTHONPATH": "/src", "TF_VAR_token": "s3cret", "HOME": "/root", "A": "1"}
        >>> forwarded_env(env, names=["A"])
        {'PYTHONPATH': '/src', 'A': '1'}
    """
    env = os.environ if environ is None else environ
    return {
        name: value for name, value in env.items()
        if name in FORWARDED_ENV or name.startswith(FORWARDED_ENV_PREFIXES) or name in names
    }


def env_payload(env: Mapping[str, str]) -> str:
    """The environment of a remote task as the JSON line its wrapper reads from stdin.

    Raises:
        ClusterConfigError: A name is not a valid environment variable name.

    Example:
        >>> json.loads(env_payload({"TF_CONFIG": '{"x": 1}'}))
        {'TF_CONFIG': '{"x": 1}'}
    """
    for name in env:
        if not _ENV_NAME.match(name):
            raise ClusterConfigError(format_error(
                "Invalid environment variable name for a remote task.", received=repr(name),
                expected="letters, digits and '_', not starting with a digit",
                fix="Rename the variable.",
            ))
    return json.dumps(dict(env)) + "\n"


def remote_shell_command(argv: Sequence[str], *, cwd: str, python: str | None = None) -> str:
    """The shell command a remote host runs for one task: cd, then the wrapper, which reads the
    task's environment from stdin (`env_payload`).

    Args:
        argv: The task's command.
        cwd: The working directory on the remote host (the launcher's: a shared filesystem).
        python: The interpreter that runs `tfdist.launcher.hosts.remote` (default: this one).

    Example:
        >>> remote_shell_command(["py", "a b.py"], cwd="/w", python="py")
        "cd /w && exec py -m tfdist.launcher.hosts.remote --env-stdin -- py 'a b.py'"
    """
    wrapper = [python or sys.executable, "-m", "tfdist.launcher.hosts.remote", "--env-stdin", "--",
               *argv]
    return f"cd {shlex.quote(cwd)} && exec {shlex.join(wrapper)}"


def find_ssh() -> str:
    """The ``ssh`` client on PATH.

    Raises:
        ClusterConfigError: ssh is not installed.
    """
    path = shutil.which("ssh")
    if path is None:
        raise ClusterConfigError(format_error(
            "The ssh client is needed to start tasks on other hosts, but it is not on PATH.",
            received=f"PATH={os.environ.get('PATH', '')}", expected="an 'ssh' executable",
            fix="Install it (Debian/Ubuntu: apt-get install openssh-client), or use only hosts "
            "that are this machine (localhost)",
        ))
    return path


def ssh_command(
    host: str,
    argv: Sequence[str],
    options: SshOptions,
    *,
    cwd: str | None = None,
    ssh: str | None = None,
) -> tuple[str, ...]:
    """The local argv that runs ``argv`` on ``host`` over ssh (its environment goes on stdin).

    Args:
        host: The remote host.
        argv: The task's command.
        options: Host keys, port and identity.
        cwd: Remote working directory (default: the current one).
        ssh: The ssh executable (default: `find_ssh`).

    Example:
        >>> ssh_command("n2", ["true"], SshOptions(port=22), cwd="/", ssh="ssh")[-5:-1]
        ('-p', '22', '--', 'n2')
    """
    command = remote_shell_command(argv, cwd=cwd or os.getcwd())
    # "--": a host name can never be read as an option (it is also checked when parsed).
    return (ssh or find_ssh(), *SSH_OPTIONS, *options.args(), "--", host.strip("[]"), command)
