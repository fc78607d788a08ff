"""The job Keras's ``initialize`` joins: processes, this one's id, the coordinator, the devices.

Keras documents ``keras.distribution.initialize(job_addresses, num_processes, process_id)`` (and
the ``KERAS_DISTRIBUTION_*`` variables) as JAX takes them. Here the job is the one
``tfdist-launch`` started: its TF_CONFIG lists the training tasks (chief first, then the
workers, `tfdist.parallel.mesh.TRAINING_ROLES`), and a process's id is its rank there. Arguments
given under a launched job must agree with it (they are checked, never applied). Outside one,
``job_addresses`` (every process's ``host:port``, comma-separated, process 0 first: TensorFlow's
collectives need every address, not only the coordinator's), ``num_processes`` and
``process_id`` become this process's TF_CONFIG, and a process other than 0 waits at most the
start-up deadline (``TFDIST_STARTUP_TIMEOUT``, default 600 s) for the coordinator's port to
answer, then fails naming what it tried.

TensorFlow-free.

Example:
    >>> env = {"TF_CONFIG": '{"cluster": {"worker": ["h:1", "h:2"]}, '
    ...        '"task": {"type": "worker", "index": 1}}'}
    >>> job = job_of(env)
    >>> job.processes, job.process_id, job.addresses, job.coordinator
    (2, 1, ('h:1', 'h:2'), 'h:1')
    >>> device_names(job, "cpu")
    ['cpu:0', 'cpu:1']
    >>> tf_config_for(["h:1", "h:2"], 1)["task"]
    {'type': 'worker', 'index': 1}
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tfdist.core.environ import peek_tf_config
from tfdist.errors import StrategyConfigError, format_error

__all__ = ["Job", "job_of", "device_names", "check_arguments", "tf_config_for",
           "wait_for_coordinator", "parse_addresses", "ADDRESSES_ENV", "PROCESSES_ENV",
           "PROCESS_ID_ENV"]

ADDRESSES_ENV = "KERAS_DISTRIBUTION_JOB_ADDRESSES"
PROCESSES_ENV = "KERAS_DISTRIBUTION_NUM_PROCESSES"
PROCESS_ID_ENV = "KERAS_DISTRIBUTION_PROCESS_ID"
_ROLES = ("chief", "worker")
_POLL_SECONDS = 0.25


@dataclasses.dataclass(frozen=True)
class Job:
    """The training processes of a job, in rank order, and this one's rank.

    Attributes:
        addresses: Every training task's ``host:port`` (chief first, then the workers).
        process_id: This process's rank.
        launched: Whether the job came from TF_CONFIG (a launched job), not arguments.
    """

    addresses: tuple[str, ...]
    process_id: int
    launched: bool = True

    @property
    def processes(self) -> int:
        return len(self.addresses)

    @property
    def coordinator(self) -> str:
        """Process 0's address (the chief, or ``worker:0`` without one)."""
        return self.addresses[0]


def job_of(environ: Mapping[str, str] | None = None) -> Job:
    """The job TF_CONFIG describes (one process, rank 0, when it is unset).

    Example:
        >>> job_of({}).processes, job_of({}).launched
        (1, False)
    """
    view = peek_tf_config(environ)
    if view is None:
        return Job(("localhost",), 0, launched=False)
    addresses = tuple(a for role in _ROLES for a in view.roles.get(role, ()))
    chiefs = view.count("chief")
    if view.task_type not in _ROLES:
        raise StrategyConfigError(format_error(
            "keras.distribution runs on the job's training tasks only.",
            received=f"task {view.task_type}:{view.task_index}", expected=f"one of {_ROLES}",
            fix="run the Keras distribution script on chief and worker tasks"))
    rank = view.task_index if view.task_type == "chief" else chiefs + view.task_index
    return Job(addresses, rank)


def device_names(job: Job, device_type: str) -> list[str]:
    """One device per process, ``"cpu:0"``.. in rank order (Keras's ``"type:id"`` form)."""
    return [f"{device_type}:{rank}" for rank in range(job.processes)]


def parse_addresses(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"h:1,h:2"`` (or a list) as a tuple; empty for None."""
    if text is None:
        return ()
    parts = text.split(",") if isinstance(text, str) else list(text)
    return tuple(p.strip() for p in parts if p and p.strip())


def check_arguments(job: Job, addresses: Sequence[str], processes: int | None,
                    process_id: int | None) -> None:
    """Refuses arguments to ``initialize`` that disagree with the launched ``job``."""
    fix = ("call keras.distribution.initialize() without arguments under tfdist-launch (it "
           "reads the job), or unset KERAS_DISTRIBUTION_*")
    if processes is not None and int(processes) != job.processes:
        raise StrategyConfigError(format_error(
            "keras.distribution.initialize: num_processes is not the launched job's.",
            received=f"num_processes={processes}", expected=f"{job.processes} (TF_CONFIG's "
            "chief and worker tasks)", fix=fix))
    if process_id is not None and int(process_id) != job.process_id:
        raise StrategyConfigError(format_error(
            "keras.distribution.initialize: process_id is not this task's rank in the job.",
            received=f"process_id={process_id}", expected=f"{job.process_id}", fix=fix))
    if addresses and tuple(addresses) not in (job.addresses, job.addresses[:1]):
        raise StrategyConfigError(format_error(
            "keras.distribution.initialize: job_addresses are not the launched job's.",
            received=f"job_addresses={','.join(addresses)}",
            expected=f"{','.join(job.addresses)} (or the coordinator {job.coordinator} alone)",
            fix=fix))


def tf_config_for(addresses: Sequence[str], process_id: int) -> dict[str, Any]:
    """The TF_CONFIG of process ``process_id`` of a job of ``addresses`` (all workers).

    Raises:
        StrategyConfigError: ``process_id`` out of range.
    """
    if not 0 <= process_id < len(addresses):
        raise StrategyConfigError(format_error(
            "keras.distribution.initialize: process_id is not one of the job's processes.",
            received=f"process_id={process_id}, {len(addresses)} address(es)",
            expected=f"0 <= process_id < {len(addresses)}",
            fix="number the processes 0..num_processes-1, process 0 the coordinator"))
    return {"cluster": {"worker": list(addresses)},
            "task": {"type": "worker", "index": int(process_id)}}


def unlaunched_job(addresses: Sequence[str], processes: int | None,
                   process_id: int | None) -> Job:
    """The job ``initialize``'s arguments describe outside a launched job.

    Raises:
        StrategyConfigError: a missing argument, or addresses that are not one per process.
    """
    if not addresses or processes is None or process_id is None:
        raise StrategyConfigError(format_error(
            "keras.distribution.initialize outside a launched job needs the whole job.",
            received=f"job_addresses={','.join(addresses) or None}, num_processes={processes}, "
            f"process_id={process_id}",
            expected="every process's host:port (process 0 first), num_processes and process_id",
            fix="start the script with tfdist-launch --workers N (nothing to pass), or pass "
                f"all three (or set {ADDRESSES_ENV}, {PROCESSES_ENV}, {PROCESS_ID_ENV})"))
    if len(addresses) != int(processes):
        raise StrategyConfigError(format_error(
            "keras.distribution.initialize: TensorFlow's collectives need every process's "
            "address, not only the coordinator's (as JAX takes it).",
            received=f"{len(addresses)} address(es) for num_processes={processes}",
            expected=f"{processes} comma-separated host:port, process 0 first",
            fix="list one host:port per process in job_addresses"))
    tf_config_for(addresses, int(process_id))
    return Job(tuple(addresses), int(process_id), launched=False)


def wait_for_coordinator(job: Job, deadline: float | None) -> None:
    """Waits (at most ``deadline`` s; None: forever) until the coordinator's port answers.

    Process 0 is the coordinator and does not wait.

    Raises:
        StrategyConfigError: nothing answered at the coordinator's address in time; the
            message names the address, the attempts and the deadline.
    """
    if job.process_id == 0:
        return
    host, _, port = job.coordinator.rpartition(":")
    start, tries, last = time.monotonic(), 0, "nothing tried"
    while True:
        tries += 1
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return
        except (OSError, ValueError) as err:
            last = repr(err)
        if deadline is not None and time.monotonic() - start >= deadline:
            break
        time.sleep(_POLL_SECONDS)
    raise StrategyConfigError(format_error(
        f"keras.distribution.initialize: no coordinator answered at {job.coordinator} within "
        f"{deadline:g} s ({tries} attempt(s); last: {last}).",
        received=f"job_addresses={','.join(job.addresses)}, process_id={job.process_id}",
        expected=f"process 0 running at {job.coordinator}",
        fix="start process 0 of the job (or every process with tfdist-launch --workers "
            f"{job.processes} script.py), check the address, or raise TFDIST_STARTUP_TIMEOUT"))


def apply(job: Job, environ: dict[str, str] | None = None) -> None:
    """Writes ``job``'s TF_CONFIG (an unlaunched job's) into ``environ`` (os.environ)."""
    env = os.environ if environ is None else environ
    env["TF_CONFIG"] = json.dumps(tf_config_for(job.addresses, job.process_id))
