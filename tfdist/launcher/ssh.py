"""Start a task on another host: the ``ssh`` command line for one task of a `JobPlan`.

A remote task runs the same Python, in the same working directory, with its environment set on
the remote command line (quoted with `shlex.quote`), under `tfdist.launcher.remote`, which stops
the task when the ssh connection closes (killing a local ``ssh`` client alone would leave the
remote process running)::

    ssh -o BatchMode=yes ... [-p PORT] [-i KEY] HOST \\
        'cd /work && exec env TF_CONFIG=... /venv/bin/python -m tfdist.launcher.remote -- ARGV'

Hosts that are this machine (``localhost``, a loopback address, this machine's hostname, or an IP
address bound to one of its interfaces) run their tasks without ssh.

Example:
    >>> options = SshOptions(port=2022, identity="/keys/id")
    >>> argv = ssh_command("n2", ["python", "t.py"], {"A": "x y"}, options, cwd="/w", ssh="ssh")
    >>> argv[-2], argv[-1].startswith("cd /w && exec env A='x y' ")
    ('n2', True)
    >>> argv[-1].endswith(" -m tfdist.launcher.remote -- python t.py")
    True
"""

from __future__ import annotations

import dataclasses
import ipaddress
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
    "ssh_command",
    "find_ssh",
]

# Options that make ssh fail instead of prompting, and accept hosts it has never seen.
SSH_OPTIONS = (
    "-o", "BatchMode=yes",
    "-o", "StrictHostKeyChecking=no",
    "-o", "UserKnownHostsFile=/dev/null",
    "-o", "LogLevel=ERROR",  # No "Permanently added ... to the list of known hosts" per task.
)
# Variables of the launcher's environment that remote tasks also get (besides each task's own).
FORWARDED_ENV = ("PYTHONPATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")
FORWARDED_ENV_PREFIXES = ("TF_", "TFDIST_", "KERAS_", "HOROVOD_", "NCCL_")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


@dataclasses.dataclass(frozen=True)
class SshOptions:
    """How to reach remote hosts.

    Attributes:
        port: The ssh port (None: ssh's default, usually 22).
        identity: A private key file for ``ssh -i`` (None: ssh's defaults).

    Example:
        >>> SshOptions(port=2022).args()
        ('-p', '2022')
    """

    port: int | None = None
    identity: str | None = None

    def args(self) -> tuple[str, ...]:
        """The ``-p``/``-i`` arguments of the ssh command line."""
        port = ("-p", str(self.port)) if self.port is not None else ()
        identity = ("-i", self.identity) if self.identity is not None else ()
        return (*port, *identity)


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


def forwarded_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of ``environ`` (default ``os.environ``) that remote tasks get too.

    Those named in `FORWARDED_ENV` and those starting with one of `FORWARDED_ENV_PREFIXES`;
    ``PATH``, ``HOME`` and the rest belong to the remote host.

    Example:
        >>> forwarded_env({"PYTHONPATH": "/src", "TF_CPP_MIN_LOG_LEVEL": "2", "HOME": "/root"})
        {'PYTHONPATH': '/src', 'TF_CPP_MIN_LOG_LEVEL': '2'}
    """
    env = os.environ if environ is None else environ
    return {
        name: value for name, value in env.items()
        if name in FORWARDED_ENV or name.startswith(FORWARDED_ENV_PREFIXES)
    }


def remote_shell_command(
    argv: Sequence[str], env: Mapping[str, str], *, cwd: str, python: str | None = None
) -> str:
    """The shell command a remote host runs for one task: cd, set env, run under the wrapper.

    Args:
        argv: The task's command.
        env: Variables to set for it.
        cwd: The working directory on the remote host (the launcher's: a shared filesystem).
        python: The interpreter that runs `tfdist.launcher.remote` (default: this one).

    Example:
        >>> remote_shell_command(["py", "a b.py"], {"TF_CONFIG": '{"x": 1}'}, cwd="/w", python="py")
        'cd /w && exec env TF_CONFIG=\\'{"x": 1}\\' py -m tfdist.launcher.remote -- py \\'a b.py\\''
    """
    for name in env:
        if not _ENV_NAME.match(name):
            raise ClusterConfigError(format_error(
                "Invalid environment variable name for a remote task.", received=repr(name),
                expected="letters, digits and '_', not starting with a digit",
                fix="Rename the variable.",
            ))
    assignments = [f"{name}={shlex.quote(value)}" for name, value in env.items()]
    wrapper = [python or sys.executable, "-m", "tfdist.launcher.remote", "--", *argv]
    words = ["exec", "env", *assignments, *(shlex.quote(word) for word in wrapper)]
    return f"cd {shlex.quote(cwd)} && {' '.join(words)}"


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
    env: Mapping[str, str],
    options: SshOptions,
    *,
    cwd: str | None = None,
    ssh: str | None = None,
) -> tuple[str, ...]:
    """The local argv that runs ``argv`` with ``env`` on ``host`` over ssh.

    Args:
        host: The remote host.
        argv: The task's command.
        env: Variables for the task (its own plus `forwarded_env`).
        options: Port and identity.
        cwd: Remote working directory (default: the current one).
        ssh: The ssh executable (default: `find_ssh`).

    Example:
        >>> ssh_command("n2", ["true"], {}, SshOptions(port=22), cwd="/", ssh="ssh")[-4:-1]
        ('-p', '22', 'n2')
    """
    command = remote_shell_command(argv, env, cwd=cwd or os.getcwd())
    return (ssh or find_ssh(), *SSH_OPTIONS, *options.args(), host.strip("[]"), command)
