"""Horovod ranks under ``srun``: Gloo's rendezvous for a Slurm job, without ``horovodrun``.

``horovodrun --gloo`` does two things for its ranks: it serves a rendezvous (an HTTP key-value
store that the ranks meet at) and gives each rank its variables (``HOROVOD_RANK``,
``HOROVOD_LOCAL_RANK``, ...). Under Slurm, ``srun`` starts the ranks, so the two are split:

* ``python -m tfdist.launcher.slurm_horovod -- srun ...`` (in the batch script, on the first
  node): serves Horovod's rendezvous on this node's address (``SLURMD_NODENAME``), prepared for
  the allocation's slots, runs the ``srun`` line with ``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``PORT``
  set, and stops the rendezvous when ``srun`` ends (returning its status).
* `rank_env` (used by ``tfdist.launcher.slurm_task`` on each task): the variables of the rank
  on this task's slot (`tfdist.cluster.slurm.slurm_slot`, so any ``--distribution`` works),
  with Gloo's interface the one that routes to the rendezvous.

Ranks are numbered host-major, as ``horovodrun`` numbers them.

Example:
    In a batch script (what ``tfdist-launch --strategy horovod --export slurm`` writes)::

        python -m tfdist.launcher.slurm_horovod -- srun --kill-on-bad-exit=1 \\
            python -m tfdist.launcher.slurm_task --strategy horovod -- python -u train.py
"""

from __future__ import annotations

import importlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from tfdist.cluster.slurm import slurm_host_slots, slurm_slot
from tfdist.errors import MissingDependencyError, StrategyConfigError, format_error
from tfdist.launcher.hosts import interface_towards

__all__ = ["RENDEZVOUS_ADDR", "RENDEZVOUS_PORT", "rank_env", "Rendezvous", "main"]

RENDEZVOUS_ADDR = "HOROVOD_GLOO_RENDEZVOUS_ADDR"
RENDEZVOUS_PORT = "HOROVOD_GLOO_RENDEZVOUS_PORT"


def _horovod(module: str) -> ModuleType:
    try:
        return importlib.import_module(f"horovod.runner.{module}")
    except ImportError as err:
        raise MissingDependencyError(format_error(
            f"Horovod ranks under srun need Horovod's runner ({err}).",
            received=f"no importable horovod.runner.{module}",
            expected="Horovod 0.28.1 built with TensorFlow and Gloo on every node",
            fix="install it on the nodes with `bash launch/setup.sh`")) from err


def _slot_plan(env: Mapping[str, str]) -> list[Any]:
    """Horovod's ``SlotInfo`` of every rank of the allocation, host-major."""
    hosts = _horovod("common.util.hosts")
    slots = slurm_host_slots(env)
    infos = [hosts.HostInfo(node, count) for node, count in slots]
    return hosts.get_host_assignments(infos, sum(count for _, count in slots))


def rank_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Horovod variables of this Slurm task's rank (see the module docstring).

    Raises:
        StrategyConfigError: the rendezvous variables are missing (not started through
            ``python -m tfdist.launcher.slurm_horovod``).
        ClusterConfigError: the Slurm variables do not describe this task.

    Example:
        >>> env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)",
        ...        "SLURMD_NODENAME": "n2", "SLURM_LOCALID": "1",
        ...        RENDEZVOUS_ADDR: "127.0.0.1", RENDEZVOUS_PORT: "5000"}
        >>> got = rank_env(env)
        >>> got["HOROVOD_RANK"], got["HOROVOD_LOCAL_RANK"], got["HOROVOD_CROSS_RANK"]
        ('3', '1', '1')
    """
    env = os.environ if env is None else env
    if not env.get(RENDEZVOUS_ADDR) or not env.get(RENDEZVOUS_PORT):
        raise StrategyConfigError(format_error(
            "Horovod ranks under srun need a rendezvous, and none is set.",
            received=f"{RENDEZVOUS_ADDR}={env.get(RENDEZVOUS_ADDR)!r}, "
                     f"{RENDEZVOUS_PORT}={env.get(RENDEZVOUS_PORT)!r}",
            expected="both set by python -m tfdist.launcher.slurm_horovod",
            fix="start srun through `python -m tfdist.launcher.slurm_horovod -- srun ...` "
                "(tfdist-launch --strategy horovod --export slurm writes it)"))
    slot = _slot_plan(env)[slurm_slot(env, slurm_host_slots(env))]
    variables = dict(_horovod("gloo_run").create_slot_env_vars(slot))
    variables.update(HOROVOD_CONTROLLER="gloo", HOROVOD_CPU_OPERATIONS="gloo",
                     **{RENDEZVOUS_ADDR: env[RENDEZVOUS_ADDR],
                        RENDEZVOUS_PORT: env[RENDEZVOUS_PORT]})
    interface = interface_towards(env[RENDEZVOUS_ADDR])
    if interface:
        variables["HOROVOD_GLOO_IFACE"] = interface
    return variables


class Rendezvous:
    """Horovod's rendezvous store, on ``address`` (a free port), prepared for the allocation.

    Example:
        >>> env = {"SLURM_JOB_NODELIST": "localhost", "SLURM_TASKS_PER_NODE": "2"}
        >>> with Rendezvous("127.0.0.1", env) as rendezvous:
        ...     rendezvous.port > 0
        True
    """

    def __init__(self, address: str, env: Mapping[str, str]) -> None:
        http = _horovod("http.http_server")
        self.address = address
        self._server = http.RendezvousHTTPServer((address, 0), http.RendezvousHandler, 0)
        self._server.init(_slot_plan(env))
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Rendezvous:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def _node_address(env: Mapping[str, str]) -> str:
    """This node's address as the other nodes reach it: its Slurm name, resolved."""
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    try:
        return socket.gethostbyname(node)
    except OSError as err:
        raise StrategyConfigError(format_error(
            "The batch node's name does not resolve, so ranks cannot reach the rendezvous.",
            received=f"SLURMD_NODENAME={node!r} ({err})", expected="a resolvable node name",
            fix="give the nodes resolvable names (DNS or /etc/hosts)")) from err


def run_srun(command: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    """Runs ``command`` (the ``srun`` line) with a rendezvous served beside it; its status."""
    env = dict(os.environ if env is None else env)
    with Rendezvous(_node_address(env), env) as rendezvous:
        env.update({RENDEZVOUS_ADDR: rendezvous.address, RENDEZVOUS_PORT: str(rendezvous.port)})
        child = subprocess.Popen(list(command), env=env)
        forward = {sig: signal.signal(sig, lambda s, _f: child.send_signal(s))
                   for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            return child.wait()
        finally:
            for sig, handler in forward.items():
                signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tfdist.launcher.slurm_horovod [--dry-run] -- srun ...``; srun's status."""
    args = list(sys.argv[1:] if argv is None else argv)
    dry_run = args[:1] == ["--dry-run"]
    args = args[dry_run:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m tfdist.launcher.slurm_horovod [--dry-run] -- srun ... (the "
              "ranks' step; --dry-run prints where the rendezvous would listen)", file=sys.stderr)
        return 2
    if dry_run:
        print(f"rendezvous on {_node_address(os.environ)}:<free port> for "
              f"{len(_slot_plan(os.environ))} rank(s); then: {shlex.join(args)}")
        return 0
    return run_srun(args)


if __name__ == "__main__":
    sys.exit(main())
