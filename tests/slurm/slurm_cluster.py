"""A private Slurm cluster for tests: munged, slurmctld and one slurmd per fake host.

`SlurmCluster.start` builds network namespaces with `fake_hosts.FakeHosts` (no sshd): host 0
runs ``slurmctld``, hosts 1.. each run a ``slurmd`` whose node is named by its address
(``10.213.0.2``), so that the names in ``SLURM_JOB_NODELIST`` resolve on every host, as a real
cluster's names do. One ``munged`` with a fresh key serves them all through a socket in the
temporary directory (Unix sockets cross network namespaces). Everything is private to the
directory: slurm.conf, the munge key, state, spool, logs and pid files. Clients (``sbatch``,
``squeue``) run in host 0's namespace with ``SLURM_CONF`` pointing at that slurm.conf.

`SlurmCluster.close` cancels every job, stops the daemons it started, and deletes the
namespaces (killing anything left in them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from fake_hosts import FakeHosts
from fake_hosts import missing_requirement as missing_namespace_requirement

TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "sinfo", "scancel")
CPUS_PER_NODE = 4  # more than this machine's cores (config_overrides): tasks just share them

_SLURM_CONF = """\
ClusterName=tfdist-test
SlurmctldHost={ctl_address}
SlurmctldPort={ctl_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
AuthInfo=socket={munge_socket}
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
LaunchParameters=use_interactive_step
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool-%n
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd-%n.pid
SlurmctldLogFile={tmp}/slurmctld.log
SlurmdLogFile={tmp}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
KillWait=5
InactiveLimit=0
MinJobAge=300
{nodes}
PartitionName=test Nodes=ALL Default=YES MaxTime=30 State=UP
"""


def missing_requirement() -> str | None:
    """Why a Slurm cluster cannot be started here (None if it can)."""
    for tool in TOOLS:
        if shutil.which(tool) is None and not os.access(f"/usr/sbin/{tool}", os.X_OK):
            return f"'{tool}' is not installed (make slurm, or apt-get install slurm-wlm munge)"
    return missing_namespace_requirement()


def _daemon(argv: Sequence[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115 - the child owns it
    return subprocess.Popen(list(argv), stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=env)


class SlurmCluster:
    """munged + slurmctld + ``nodes`` slurmd hosts in namespaces (see the module docstring)."""

    def __init__(self, tmp: Path, nodes: int) -> None:
        self.tmp = tmp
        self.hosts: FakeHosts | None = None
        self.node_count = nodes
        self.daemons: list[subprocess.Popen[bytes]] = []
        self.conf = tmp / "slurm.conf"
        self.munge_socket = tmp / "munge.sock"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        for name in list(self.env):  # a surrounding allocation must not leak into ours
            if name.startswith(("SLURM_", "SBATCH_", "SRUN_")) and name != "SLURM_CONF":
                del self.env[name]

    @property
    def nodes(self) -> list[str]:
        assert self.hosts is not None
        return self.hosts.addresses[1:]

    @classmethod
    def start(cls, tmp: Path, nodes: int = 2, timeout: float = 60.0) -> SlurmCluster:
        cluster = cls(tmp, nodes)
        try:
            cluster.hosts = FakeHosts.start(tmp, count=nodes + 1, sshd_on=(), label="s")
            cluster._write_config()
            cluster._start_munged(timeout)
            cluster._start_slurm()
            cluster.wait_nodes_idle(timeout)
        except BaseException:
            cluster.close()
            raise
        return cluster

    def _write_config(self) -> None:
        assert self.hosts is not None
        for sub in ("state", "munge"):
            (self.tmp / sub).mkdir(mode=0o700, exist_ok=True)
        nodes = "\n".join(
            f"NodeName={name} NodeAddr={name} NodeHostname={name} CPUs={CPUS_PER_NODE} "
            "RealMemory=1000 State=UNKNOWN" for name in self.nodes)
        self.conf.write_text(_SLURM_CONF.format(
            ctl_address=self.hosts.addresses[0], ctl_port=6817, slurmd_port=6818,
            munge_socket=self.munge_socket, tmp=self.tmp, nodes=nodes))
        # slurmd loads a cgroup plugin even with proctrack/linuxproc; autodetection fails on
        # hosts whose /sys/fs/cgroup is a tmpfs of v1 hierarchies (containers).
        (self.tmp / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        key = self.tmp / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)

    def _start_munged(self, timeout: float) -> None:
        munge = self.tmp / "munge"
        self.daemons.append(_daemon(
            ["munged", "--foreground", "--force", f"--key-file={munge / 'munge.key'}",
             f"--socket={self.munge_socket}", f"--pid-file={munge / 'munged.pid'}",
             f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'munged.seed'}"],
            munge / "munged.out", self.env))
        self._wait(lambda: self.munge_socket.exists(), timeout, "munged socket")

    def _start_slurm(self) -> None:
        assert self.hosts is not None
        hosts = self.hosts
        self.daemons.append(_daemon(
            hosts.exec_argv(0, self._named(hosts.addresses[0], f"slurmctld -D -i -f {self.conf}")),
            self.tmp / "slurmctld.out", self.env))
        for i, name in enumerate(self.nodes, start=1):
            (self.tmp / f"spool-{name}").mkdir(exist_ok=True)
            start = f"slurmd -D -N {name} -f {self.conf}"
            self.daemons.append(_daemon(
                hosts.exec_argv(i, self._named(name, start)),
                self.tmp / f"slurmd-{name}.out", self.env))

    @staticmethod
    def _named(hostname: str, command: str) -> list[str]:
        """``command`` in its own UTS namespace whose hostname is ``hostname`` (a Slurm name)."""
        return ["unshare", "--uts", "sh", "-c", f"hostname {hostname} && exec {command}"]

    def client(self, argv: Sequence[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        """Runs a Slurm client command (``sbatch``, ``squeue``) on host 0."""
        assert self.hosts is not None
        options = {"capture_output": True, "text": True, "timeout": 30, "check": False,
                   "env": self.env, **kwargs}
        return subprocess.run(self.hosts.exec_argv(0, list(argv)), **options)  # type: ignore

    def run_batch(self, argv: Sequence[str], timeout: float,
                  **kwargs: object) -> subprocess.CompletedProcess[str]:
        """``sbatch ARGV`` and its end (`wait_job`): what ``sbatch --wait`` gives, without its
        growing sleeps between polls (2, 8, then 32 s here: jobs of 7-10 s were seen to end
        after 42)."""
        submitted = self.client(["sbatch", "--parsable", *argv], **kwargs)
        if submitted.returncode != 0:
            return submitted
        status = self.wait_job(submitted.stdout.strip().split(";")[0], timeout)
        return subprocess.CompletedProcess(argv, status, submitted.stdout, submitted.stderr)

    def wait_job(self, job: str, timeout: float) -> int:
        """Polls ``scontrol`` every 0.2 s until job ``job`` has ended; its exit status (its
        ``ExitCode``, or 1 if it ended in another state than COMPLETED with 0). Past
        ``timeout`` seconds the job is cancelled and `subprocess.TimeoutExpired` raised."""
        deadline = time.monotonic() + timeout
        while True:
            shown = self.client(["scontrol", "show", "job", "-o", job]).stdout
            fields = dict(f.split("=", 1) for f in shown.split() if "=" in f)
            state = fields.get("JobState", "")
            if state and state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
                status = int(fields.get("ExitCode", "1:0").split(":")[0])
                return status or int(state != "COMPLETED")
            if time.monotonic() > deadline:
                self.client(["scancel", job])
                raise subprocess.TimeoutExpired(["scontrol", "show", "job", job], timeout)
            time.sleep(0.2)

    def wait_nodes_idle(self, timeout: float) -> None:
        def idle() -> bool:
            out = self.client(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout.split("\n")
            states = dict(line.split() for line in out if line.strip())
            return len(states) == self.node_count and set(states.values()) == {"idle"}
        self._wait(idle, timeout, "Slurm nodes idle")

    def _wait(self, ready: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():  # type: ignore[operator]
            for proc in self.daemons:
                if proc.poll() is not None:
                    raise RuntimeError(f"waiting for {what}: {proc.args} exited {proc.returncode}"
                                       f"\n{self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}\n"
                                   f"{self.logs()}")
            time.sleep(0.2)

    def logs(self) -> str:
        parts = []
        for path in sorted(self.tmp.glob("*.log")) + sorted(self.tmp.glob("*.out")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-2000:]}")
        return "\n".join(parts)

    def close(self) -> None:
        """Cancels every job, stops the daemons and deletes the namespaces."""
        if self.daemons and self.daemons[-1].poll() is None:
            try:
                self.client(["scancel", "--full", "--quiet", "--user=root"], timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for proc in reversed(self.daemons):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.daemons):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.hosts is not None:
            self.hosts.close()  # also kills anything left in the namespaces
