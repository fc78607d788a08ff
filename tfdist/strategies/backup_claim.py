"""A backup directory claimed by one job, for the layout its backups were written for.

A rank's backup of a model split across processes (tensor, pipeline) holds that rank's shard or
stage: resumed under another mesh it fits nothing (another ``--tensor``: Keras shape errors), or
worse, fits some ranks only (another ``--workers``: replica 0 resumes, replica 1 starts afresh,
their collectives pair up wrongly). And two jobs writing one directory delete each other's
backups at their end. So, before ``fit``, on every rank (`claim_backup`):

* the rank takes an exclusive lock (``flock``) on ``.tfdist-lock`` in the directory it writes,
  held until its process ends: a second job naming the same directory is refused while the
  first one runs;
* the layout the strategy's backups depend on (`backup_layout`: its mesh, and for the pipeline
  its stages and chunks) is compared with the one every rank's backup recorded
  (``layout.json`` in each ``rank-<r>``); any difference is refused, naming both, on every
  rank (each reads every rank's record), before anything is restored or deleted;
* this rank's record is written (it goes with its backup when the backup is deleted).

Example:
    >>> import tempfile
    >>> class Strategy:
    ...     per_rank_backups, worker_index, is_chief = True, 0, True
    ...     def backup_layout(self):
    ...         return {"strategy": "tensor", "data": 1, "tensor": 2}
    >>> directory = tempfile.mkdtemp()
    >>> claim_backup(Strategy(), directory + "/rank-0", directory)
    >>> sorted(os.listdir(directory + "/rank-0"))
    ['.tfdist-lock', 'layout.json']
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import Any

from tfdist.errors import StrategyConfigError, format_error

__all__ = ["claim_backup", "release_backup", "LAYOUT_FILE", "LOCK_FILE"]

LAYOUT_FILE = "layout.json"
LOCK_FILE = ".tfdist-lock"
_held: dict[str, int] = {}
"""Lock files this process holds (path -> descriptor): a second ``fit`` in the same process
claims the same directory again, and must not be refused by its own lock."""


def claim_backup(strategy: Any, written: str, job_directory: str) -> None:
    """Locks ``written`` (where this process writes its backup) for this job and, for a
    strategy with a `backup_layout`, checks every rank's record in ``job_directory`` against
    it and records this rank's.

    Raises:
        StrategyConfigError: another running job holds the directory, or a backup there was
            written for another layout.
    """
    os.makedirs(written, exist_ok=True)
    _lock(written, job_directory)
    layout = getattr(strategy, "backup_layout", lambda: None)()
    if layout is None:
        return
    for record in sorted(Path(job_directory).glob(f"rank-*/{LAYOUT_FILE}")):
        _check_layout(record, layout, job_directory)
    temporary = os.path.join(written, f".{LAYOUT_FILE}.{os.getpid()}")
    with open(temporary, "w") as out:
        json.dump(layout, out, sort_keys=True)
    os.replace(temporary, os.path.join(written, LAYOUT_FILE))


def release_backup(written: str) -> None:
    """After the backup in ``written`` was deleted (a finished ``fit``): removes its record and
    lock, and the directory if nothing else is left in it. A callback whose Keras deletes only
    its own files (tf-keras) calls it; the others delete the whole directory."""
    for name in (LAYOUT_FILE, LOCK_FILE):
        path = os.path.join(written, name)
        descriptor = _held.pop(os.path.realpath(path), None)
        if descriptor is not None:
            os.close(descriptor)
        with contextlib.suppress(OSError):
            os.remove(path)
    with contextlib.suppress(OSError):
        os.rmdir(written)


def _lock(written: str, job_directory: str) -> None:
    path = os.path.realpath(os.path.join(written, LOCK_FILE))
    if path in _held and os.path.exists(path):
        return
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(descriptor)
        raise StrategyConfigError(format_error(
            f"The backup directory {job_directory} is in use by another running job (a process "
            f"of it holds the lock {path}); both would write its backups, and the first to "
            "finish would delete them under the other.", received=job_directory,
            expected="a backup directory no other running job uses",
            fix="give each job its own backup directory (e.g. one per experiment), or wait "
                "until the other job has ended")) from err
    previous = _held.pop(path, None)
    if previous is not None:  # its file was deleted with an earlier backup
        os.close(previous)
    _held[path] = descriptor


def _differences(recorded: dict[str, Any], layout: dict[str, Any]) -> list[str]:
    """``field: recorded -> now`` for each field both know and disagree on."""
    return [f"{field}={recorded[field]!r} (now {layout[field]!r})"
            for field in sorted(recorded.keys() & layout.keys())
            if recorded[field] is not None and layout[field] is not None
            and recorded[field] != layout[field]]


def _check_layout(record: Path, layout: dict[str, Any], job_directory: str) -> None:
    try:
        recorded = json.loads(record.read_text())
    except (OSError, ValueError):
        return  # deleted while read (its rank finished), or being replaced: nothing to hold
    differences = _differences(recorded, layout)
    if not differences:
        return
    flags = _launch_flags(recorded)
    raise StrategyConfigError(format_error(
        f"The backup in {job_directory} was written for another layout: {record.parent.name}'s "
        f"backup has {', '.join(differences)}. Resumed under this one, its shards would not "
        "fit (or some ranks would resume and others start afresh).",
        received=f"layout {json.dumps(layout, sort_keys=True)}",
        expected=f"the backup's layout {json.dumps(recorded, sort_keys=True)}",
        fix=f"resume with the layout it was written for ({flags}), or move {job_directory} "
            "away to start afresh"))


def _launch_flags(layout: dict[str, Any]) -> str:
    """The ``tfdist-launch`` flags of ``layout``."""
    stages = int(layout.get("stages") or 1)
    tensor = int(layout.get("tensor") or 1)
    processes = int(layout.get("processes") or layout.get("data", 1) * stages * tensor)
    flags = [f"--strategy {layout.get('strategy')}", f"--workers {processes}"]
    if layout.get("strategy") == "pipeline":
        flags.append(f"--stages {stages}")
    if tensor > 1:
        flags.append(f"--tensor {tensor}")
    if int(layout.get("chunks") or 1) > 1:
        flags.append(f"--chunks {layout['chunks']}")
    if layout.get("zero"):
        flags.append(f"--zero {layout['zero']}")
    return " ".join(flags)
