"""Horovod ranks under ``srun``: Gloo's rendezvous for a Slurm job, without ``horovodrun``.

``horovodrun --gloo`` does two things for its ranks: it serves a rendezvous (an HTTP key-value
store that the ranks meet at) and gives each rank its variables (``HOROVOD_RANK``,
``HOROVOD_LOCAL_RANK``, ...). Under Slurm, ``srun`` starts the ranks, so the two are split:

* ``python -m tfdist.launcher.slurm.horovod -- srun ...`` (in the batch script, on the first
  node): serves Horovod's rendezvous on this node's address (``SLURMD_NODENAME``), prepared for
  the allocation's slots, runs the ``srun`` line with ``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``PORT``
  set, and stops the rendezvous when ``srun`` ends (returning its status).
* `rank_env` (used by ``tfdist.launcher.slurm.task`` on each task): the variables of the rank
  on this task's slot (`tfdist.cluster.slurm.slurm_slot`, so any ``--distribution`` works),
  with Gloo's interface the one that routes to the rendezvous.

Ranks are numbered host-major, as ``horovodrun`` numbers them.

Example:
    In a batch script (what ``tfdist-launch --strategy horovod --export slurm`` writes)::

        python -m tfdist.launcher.slurm.horovod -- srun --kill-on-bad-exit=1 \\
            python -m tfdist.launcher.slurm.task --strategy horovod -- python -u train.py
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from tfdist.cluster.slurm import slurm_host_slots, slurm_slot
from tfdist.errors import StrategyConfigError, format_error
from tfdist.horovod.rendezvous import (
    RENDEZVOUS_ADDR,
    RENDEZVOUS_PORT,
    GlooRendezvous,
    rank_variables,
    slot_plan,
)
from tfdist.launcher.hosts.layout import interface_towards

__all__ = ["RENDEZVOUS_ADDR", "RENDEZVOUS_PORT", "rank_env", "main"]


def _slot_plan(env: Mapping[str, str]) -> list[Any]:
    """Horovod's ``SlotInfo`` of every rank of the allocation, host-major."""
    return slot_plan(slurm_host_slots(env))


def rank_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Horovod variables of this Slurm task's rank (see the module docstring).

    Raises:
        StrategyConfigError: the rendezvous variables are missing (not started through
            ``python -m tfdist.launcher.slurm.horovod``).
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
            expected="both set by python -m tfdist.launcher.slurm.horovod",
            fix="start srun through `python -m tfdist.launcher.slurm.horovod -- srun ...` "
                "(tfdist-launch --strategy horovod --export slurm writes it)"))
    slot = _slot_plan(env)[slurm_slot(env, slurm_host_slots(env))]
    return rank_variables(slot, env[RENDEZVOUS_ADDR], env[RENDEZVOUS_PORT],
                          interface_towards(env[RENDEZVOUS_ADDR]))


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
    with GlooRendezvous(_node_address(env), _slot_plan(env)) as rendezvous:
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
    """``python -m tfdist.launcher.slurm.horovod [--dry-run] -- srun ...``; srun's status."""
    args = list(sys.argv[1:] if argv is None else argv)
    dry_run = args[:1] == ["--dry-run"]
    args = args[dry_run:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m tfdist.launcher.slurm.horovod [--dry-run] -- srun ... (the "
              "ranks' step; --dry-run prints where the rendezvous would listen)", file=sys.stderr)
        return 2
    if dry_run:
        print(f"rendezvous on {_node_address(os.environ)}:<free port> for "
              f"{len(_slot_plan(os.environ))} rank(s); then: {shlex.join(args)}")
        return 0
    return run_srun(args)


if __name__ == "__main__":
    sys.exit(main())
