"""Elastic Horovod on this machine: ``--strategy horovod --min-workers A --max-workers B``.

Horovod's elastic mode (``horovodrun --min-np A --max-np B --host-discovery-script S``, Gloo only)
keeps a job of ``hvd.elastic.run`` going while ranks come and go: when a rank dies, the others
restore the last ``state.commit()`` and carry on with fewer ranks (never fewer than A); when the
discovery script lists a slot again, a new rank starts there, receives the state from rank 0 and
the job grows back (never beyond B).

Horovod leaves out a *host* whose rank failed. On one machine every slot is therefore a host of its
own, named by its own loopback address (``127.0.1.1``, ``127.0.1.2``, ...), which tfdist adds to
``lo`` in the job's private network namespace (`tfdist.launcher.local.netns`), so Horovod sees each
as this machine and starts its rank without ssh. A failed slot is left out for a cooldown
(`COOLDOWN_SECONDS`: 2-3 s after a first failure, doubling after each, at most 60 s), then used
again while the discovery lists it.

The discovery script is tfdist's: written in a temporary directory of the job (removed after the
run), it prints the file named by `HOSTS_FILE_ENV` (also set on every rank, and logged at start),
one ``host:slots`` line per slot. At start it lists the ``--workers`` first slots. Edit that file
to change the job while it runs (replace it whole, e.g. with `write_hosts`): remove a line and
that slot's rank is stopped; add one (up to ``--max-workers`` slots) and a rank starts there.

Example:
    >>> slot_addresses(3)
    ('127.0.1.1', '127.0.1.2', '127.0.1.3')
    >>> elastic_args(1, 2, "/tmp/d/discover.sh")[:4]
    ('--min-np', '1', '--max-np', '2')
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tfdist.core.traits import StrategyTraits
    from tfdist.launcher.options import JobOptions

__all__ = [
    "HOSTS_FILE_ENV",
    "COOLDOWN_SECONDS",
    "MAX_LOCAL_SLOTS",
    "slot_addresses",
    "elastic_problem",
    "write_hosts",
    "Discovery",
    "elastic_args",
]

HOSTS_FILE_ENV = "TFDIST_ELASTIC_HOSTS_FILE"
"""Names the file of ``host:slots`` lines the job's discovery script prints (set on every rank)."""

COOLDOWN_SECONDS = (1, 60)
"""``horovodrun --blacklist-cooldown-range``: a slot whose rank failed is left out for
1 x 2^failures (+ up to 1) seconds, at most 60, then used again while the discovery lists it."""

MAX_LOCAL_SLOTS = 254
"""Slots on this machine: one loopback address each, ``127.0.1.1`` to ``127.0.1.254``."""

_SUBNET = "127.0.1"
_NIC = "lo"
_SCRIPT = """#!/bin/sh
# tfdist-launch's host discovery for horovodrun: the job's slots, one host:slots line each.
# Edit {hosts} (replace it whole) to add or remove slots while the job runs.
exec cat '{hosts}'
"""


def slot_addresses(count: int) -> tuple[str, ...]:
    """The loopback address naming each of ``count`` slots on this machine."""
    return tuple(f"{_SUBNET}.{k + 1}" for k in range(count))


def elastic_problem(options: JobOptions, strategy: str, traits: StrategyTraits) -> str | None:
    """What is wrong with ``--min-workers``/``--max-workers``, as a one-line message, or None.

    Example:
        >>> from tfdist.launcher.plan import JobOptions
        >>> from tfdist.core.traits import HOROVOD
        >>> elastic_problem(JobOptions("t.py", workers=3, min_workers=1, max_workers=2),
        ...                 "horovod", HOROVOD)[:45]
        '--workers 3 is outside --min-workers 1 .. --m'
    """
    low, high = options.min_workers, options.max_workers
    if low is None and high is None:
        return None
    asked = f"--min-workers {low} --max-workers {high}"
    if low is None or high is None:
        given, missing = (f"--max-workers {high}", "--min-workers") if low is None else (
            f"--min-workers {low}", "--max-workers")
        return (f"{given} was given without {missing}. Received: {given}. Expected: both (the "
                f"fewest ranks the job goes on with, and the most it grows to). Fix: add "
                f"{missing}")
    if not traits.elastic:
        return (f"{asked} was given with --strategy {strategy}, whose job cannot change size "
                "while it runs (only horovodrun's elastic mode can). Fix: drop them, or use "
                "--strategy horovod with hvd.elastic.run in the script")
    return _bounds_problem(options, asked) or _runner_problem(options, asked)


def _bounds_problem(options: JobOptions, asked: str) -> str | None:
    low, high, workers = options.min_workers or 0, options.max_workers or 0, options.workers
    if low < 1:
        return f"--min-workers must be at least 1. Received: {low}. Fix: e.g. --min-workers 1"
    if not low <= workers <= high:
        return (f"--workers {workers} is outside --min-workers {low} .. --max-workers {high}. "
                f"Received: --workers {workers} {asked}. Expected: min <= workers <= max. Fix: "
                "start with a --workers between the two (or widen the range)")
    if high > MAX_LOCAL_SLOTS:
        return (f"--max-workers must be at most {MAX_LOCAL_SLOTS} on one machine (one loopback "
                f"address per slot). Received: {high}. Fix: lower --max-workers")
    return None


def _runner_problem(options: JobOptions, asked: str) -> str | None:
    if options.mpi:
        return (f"{asked} was given with --mpi, but Horovod's elastic mode runs over Gloo only. "
                "Fix: drop --mpi")
    if options.hosts is not None:
        return (f"{asked} was given with --hosts/--hostfile; tfdist-launch runs elastic jobs on "
                "this machine only. Fix: drop --hosts, or run horovodrun --host-discovery-script "
                "yourself across machines")
    if options.network != "private":
        return (f"{asked} was given with --network {options.network}. Each slot is named by its "
                "own loopback address (127.0.1.k), which tfdist adds only inside the job's "
                "private network namespace; on the host network horovodrun would ssh to them. "
                "Fix: drop --network host")
    return None


def write_hosts(path: str | os.PathLike[str], hosts: Sequence[str]) -> None:
    """Replaces the discovery file at ``path`` with ``hosts`` (``"127.0.1.1:1"`` each), whole.

    The new content is written beside it and renamed over it, so that the discovery script,
    which Horovod runs every second, never reads a half-written file.

    Example:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "hosts"
        >>> write_hosts(path, ["127.0.1.1:1"]); path.read_text()
        '127.0.1.1:1\\n'
    """
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    partial.write_text("".join(f"{host}\n" for host in hosts))
    partial.replace(path)


class Discovery:
    """The discovery script and hosts file of one run, in a temporary directory of its own.

    Args:
        hosts: The ``host:slots`` lines listed at start.

    Example:
        >>> discovery = Discovery(["127.0.1.1:1", "127.0.1.2:1"])
        >>> Path(discovery.hosts_file).read_text().split()
        ['127.0.1.1:1', '127.0.1.2:1']
        >>> discovery.remove(); Path(discovery.directory).exists()
        False
    """

    def __init__(self, hosts: Sequence[str]) -> None:
        self.directory = tempfile.mkdtemp(prefix="tfdist-elastic-")
        self.hosts_file = os.path.join(self.directory, "hosts")
        self.script = os.path.join(self.directory, "discover.sh")
        write_hosts(self.hosts_file, hosts)
        Path(self.script).write_text(_SCRIPT.format(hosts=self.hosts_file))
        os.chmod(self.script, stat.S_IRWXU)

    def remove(self) -> None:
        """Deletes the directory (after the run, or when it will not run)."""
        shutil.rmtree(self.directory, ignore_errors=True)


def elastic_args(min_workers: int, max_workers: int, script: str) -> tuple[str, ...]:
    """``horovodrun``'s elastic options for a job on this machine.

    ``--network-interfaces lo`` also skips horovodrun's interface probe, which in elastic mode
    waits for two hosts before the first rank starts.
    """
    low, high = COOLDOWN_SECONDS
    return ("--min-np", str(min_workers), "--max-np", str(max_workers),
            "--host-discovery-script", script, "--network-interfaces", _NIC,
            "--blacklist-cooldown-range", str(low), str(high))
