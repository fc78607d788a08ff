"""Fake hosts on this machine for multi-host tests: network namespaces, each with its own sshd.

`FakeHosts.start` builds, for ``count`` hosts:

* a switch namespace holding a bridge (so nothing is added to this machine's own network), and
  one namespace per host joined to it by a veth pair, with the address ``10.213.0.<i + 1>/24``;
* an OpenSSH server in each host namespace (listed in ``sshd_on``), on port 2022, with a host key
  and an authorized key generated in a temporary directory (root login by key only), in its own
  UTS namespace whose hostname is the host's address.

All namespaces share this filesystem, so the hosts see the same checkout, venv and result files.
`FakeHosts.close` kills what it started and deletes the namespaces (with their veths and bridge).
Needs root, ``ip`` (iproute2), ``unshare`` (util-linux), ``sshd`` (openssh-server) and
``ssh``/``ssh-keygen`` (openssh-client); `missing_requirement` says which one is absent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

SUBNET = "10.213.0"
SSH_PORT = 2022
SSHD = "/usr/sbin/sshd"

_SSHD_CONFIG = """\
Port {port}
ListenAddress {address}
HostKey {host_key}
AuthorizedKeysFile {authorized_keys}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
LogLevel ERROR
"""


def missing_requirement() -> str | None:
    """Why fake hosts cannot be built here (None if they can)."""
    if os.geteuid() != 0:
        return "needs root (creates network namespaces and runs sshd)"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux"),
                          ("ssh", "openssh-client"), ("ssh-keygen", "openssh-client")):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (apt-get install {package})"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is not installed (apt-get install openssh-server)"
    return None


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)


class FakeHosts:
    """Namespaces that look like separate hosts reachable over ssh (see the module docstring)."""

    def __init__(
        self, tmp: Path, count: int, *, label: str = "", own_hostnames: bool = True
    ) -> None:
        tag = f"tfd{os.getpid() % 100000}{label}"
        self.tmp = tmp
        self.own_hostnames = own_hostnames
        self.switch = f"{tag}sw"
        self.namespaces = [f"{tag}h{i}" for i in range(count)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(count)]
        self.identity = str(tmp / "id_ed25519")
        self.known_hosts = str(tmp / "known_hosts")  # the hosts' real keys, for the launcher
        self.ssh_port = SSH_PORT
        self.sshd: list[subprocess.Popen[bytes]] = []

    @classmethod
    def start(
        cls, tmp: Path, count: int = 3, sshd_on: Sequence[int] = (1, 2), *, label: str = "",
        own_hostnames: bool = True,
    ) -> FakeHosts:
        """Builds the hosts. ``label`` tells apart several sets in one process.

        With ``own_hostnames=False`` every host keeps this machine's hostname, which resolves to
        a loopback address, as on a Debian host whose name maps to 127.0.1.1.
        """
        hosts = cls(tmp, count, label=label, own_hostnames=own_hostnames)
        try:
            hosts.forget_host_keys()
            hosts._network()
            hosts._keys()
            for i in sshd_on:
                hosts._start_sshd(i)
            for i in sshd_on:
                hosts._wait_for_sshd(i)
        except BaseException:
            hosts.close()
            raise
        return hosts

    def exec_argv(self, host: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside host ``host``'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[host], *argv]

    def ssh_argv(self, host: int) -> list[str]:
        """The ssh options that reach host ``host`` (run from a namespace of the same subnet)."""
        return ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                "-p", str(self.ssh_port), "-i", self.identity, self.addresses[host]]

    def pids(self, host: int) -> list[int]:
        """Every process running in host ``host``'s namespace."""
        out = subprocess.run(["ip", "netns", "pids", self.namespaces[host]], capture_output=True,
                             text=True, check=False).stdout
        return [int(pid) for pid in out.split()]

    def task_pids(self, host: int) -> list[int]:
        """The processes of host ``host`` other than its sshd listener."""
        listeners = {proc.pid for proc in self.sshd}
        return [pid for pid in self.pids(host) if pid not in listeners]

    def forget_host_keys(self) -> None:
        """Removes the hosts from ``~/.ssh/known_hosts``.

        ``horovodrun``'s own ssh records each host's key there (tfdist's ssh does not); the next
        run's new host keys would then print a "REMOTE HOST IDENTIFICATION HAS CHANGED" warning.
        """
        for address in self.addresses:
            subprocess.run(["ssh-keygen", "-R", f"[{address}]:{self.ssh_port}"],
                           capture_output=True, check=False)

    def _network(self) -> None:
        _run("ip", "netns", "add", self.switch)
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i, ns in enumerate(self.namespaces):
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", self.switch, "link", "add", f"port{i}", "type", "veth",
                 "peer", "name", "eth0", "netns", ns)
            _run("ip", "-n", self.switch, "link", "set", f"port{i}", "master", "br0", "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")

    def _keys(self) -> None:
        for name in ("host_key", "id_ed25519"):
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.tmp / name))
        shutil.copy(self.tmp / "id_ed25519.pub", self.tmp / "authorized_keys")
        key = (self.tmp / "host_key.pub").read_text().split()[:2]
        Path(self.known_hosts).write_text("".join(
            f"[{address}]:{self.ssh_port} {' '.join(key)}\n" for address in self.addresses))

    def _start_sshd(self, i: int) -> None:
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
        config = self.tmp / f"sshd_{i}.conf"
        config.write_text(_SSHD_CONFIG.format(
            port=self.ssh_port, address=self.addresses[i], host_key=self.tmp / "host_key",
            authorized_keys=self.tmp / "authorized_keys",
        ))
        log = open(self.tmp / f"sshd_{i}.log", "wb")
        # Its own hostname too (UTS namespace), named by its address so that it resolves to it,
        # as a real host's name does: Gloo (Horovod's process sets) binds to the hostname's
        # address, which would otherwise be this machine's loopback on every fake host.
        rename = f"hostname {self.addresses[i]} && " if self.own_hostnames else ""
        start = f"{rename}exec {SSHD} -D -e -f {config}"
        self.sshd.append(subprocess.Popen(
            self.exec_argv(i, ["unshare", "--uts", "sh", "-c", start]), stdout=log, stderr=log,
            stdin=subprocess.DEVNULL,
        ))

    def _wait_for_sshd(self, i: int, timeout: float = 20.0) -> None:
        """Waits until host 0's namespace can run a command on host ``i`` over ssh."""
        deadline = time.monotonic() + timeout
        while True:
            probe = subprocess.run(self.exec_argv(0, [*self.ssh_argv(i), "true"]),
                                   capture_output=True, text=True, timeout=30, check=False)
            if probe.returncode == 0:
                return
            if time.monotonic() > deadline:
                log = (self.tmp / f"sshd_{i}.log").read_text(errors="replace")
                raise RuntimeError(f"sshd on {self.addresses[i]} not reachable: "
                                   f"{probe.stderr.strip()} / sshd log: {log.strip()}")
            time.sleep(0.2)

    def close(self) -> None:
        """Kills every process in the namespaces (sshd, leftovers) and deletes them."""
        for proc in self.sshd:
            proc.terminate()
        for proc in self.sshd:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for i in range(len(self.namespaces)):
            for pid in self.pids(i):  # only processes started in our own namespaces
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
        for ns in [*self.namespaces, self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        self.forget_host_keys()
