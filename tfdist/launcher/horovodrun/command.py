"""The one ``horovodrun`` process of a Horovod job: its arguments, each rank's command and host.

``-np N`` and ``--gloo`` (``--mpi``: OpenMPI's ``mpirun`` starts the ranks), ``-H`` on
``--hosts``, where each remote rank runs under `tfdist.launcher.hosts.remote` (horovodrun stops
a rank by killing its local ssh client, which alone would leave the remote process running);
elastic (``--min-workers``/``--max-workers``): each slot a host of its own
(`tfdist.launcher.horovodrun.elastic`). `tfdist.launcher.placement` turns it into the placement
``--dry-run`` prints and the local runner starts.

Example:
    >>> from tfdist.launcher.options import JobOptions
    >>> from tfdist.launcher.plan import plan_job
    >>> command = horovodrun_command(plan_job(JobOptions("t.py", strategy="horovod", workers=2)))
    >>> command.args, command.hosts
    (('-np', '2', '--gloo'), ('localhost', 'localhost'))
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tfdist.errors import StrategyConfigError
from tfdist.horovod.checks import check_controller
from tfdist.launcher.horovodrun.elastic import (
    HOSTS_FILE_ENV,
    Discovery,
    elastic_args,
    slot_addresses,
)
from tfdist.launcher.hosts.layout import has_remote_host, horovodrun_host_args, rank_hosts

if TYPE_CHECKING:
    from tfdist.launcher.plan import JobPlan

__all__ = ["HorovodrunCommand", "horovodrun_command", "horovodrun_path"]


@dataclasses.dataclass(frozen=True)
class HorovodrunCommand:
    """``horovodrun ARGS RANK_COMMAND`` and the ranks it starts.

    Attributes:
        args: horovodrun's own arguments.
        rank_command: What each rank runs.
        hosts: Each rank's host, by rank.
        env: Variables of the horovodrun process (and so of every rank).
        discovery: An elastic job's discovery script and hosts file (None: not elastic).
    """

    args: tuple[str, ...]
    rank_command: tuple[str, ...]
    hosts: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    discovery: Discovery | None = None

    @property
    def argv(self) -> tuple[str, ...]:
        """The whole command line of the horovodrun process."""
        return (horovodrun_path(), *self.args, *self.rank_command)


def horovodrun_path() -> str:
    """``horovodrun`` on PATH, else the one beside this Python (a venv not on PATH)."""
    beside = Path(sys.executable).parent / "horovodrun"
    return shutil.which("horovodrun") or str(beside)


def horovodrun_command(plan: JobPlan) -> HorovodrunCommand:
    """The horovodrun process of ``plan`` (a ``launch == "ranks"`` strategy).

    Raises:
        StrategyConfigError: The controller asked for (Gloo, or MPI with ``--mpi``) is not
            there.
    """
    if plan.options.elastic:
        return _elastic(plan)
    hosts, count = plan.options.hosts, plan.roles["worker"]
    rank_command = plan.task_argv("worker")
    host_names = ["localhost"] * count
    host_args: tuple[str, ...] = ("-np", str(count))
    if hosts is not None:
        host_names = rank_hosts(hosts, count, plan.strategy)
        host_args += horovodrun_host_args(hosts)
        if has_remote_host(hosts):
            rank_command = (sys.executable, "-m", "tfdist.launcher.hosts.remote", "--",
                            *rank_command)
    if plan.options.mpi:
        _check_mpirun()
    controller = "mpi" if plan.options.mpi else "gloo"
    check_controller(controller)
    return HorovodrunCommand((*host_args, f"--{controller}"), rank_command, tuple(host_names),
                             tuple(plan.env.items()))


def _elastic(plan: JobPlan) -> HorovodrunCommand:
    """``horovodrun`` in elastic mode: each slot a host of its own (a loopback address)."""
    options, count = plan.options, plan.roles["worker"]
    assert options.min_workers is not None and options.max_workers is not None
    check_controller("gloo")  # elastic Horovod runs on Gloo only; checked before any file exists
    hosts = slot_addresses(count)
    discovery = Discovery([f"{host}:1" for host in hosts])
    args = ("-np", str(count),
            *elastic_args(options.min_workers, options.max_workers, discovery.script), "--gloo")
    env = (*plan.env.items(), (HOSTS_FILE_ENV, discovery.hosts_file))
    return HorovodrunCommand(args, plan.task_argv("worker"), tuple(hosts), env, discovery)


def _check_mpirun() -> None:
    """``horovodrun --mpi`` starts ranks with OpenMPI's mpirun (not needed to export a job)."""
    if shutil.which("mpirun") is None:
        raise StrategyConfigError(
            "--mpi needs OpenMPI's mpirun, which is not on PATH. Fix: apt-get install "
            "openmpi-bin libopenmpi-dev, then bash launch/setup.sh (Horovod is rebuilt with "
            "MPI), or drop --mpi to use Gloo")
