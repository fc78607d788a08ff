"""Run a `JobPlan` on this machine: gang start, prefixed output, stop everything on failure."""

from __future__ import annotations

import json
import os
import signal
import sys
from types import FrameType

from tfdist.errors import TaskFailedError, TaskTimeoutError
from tfdist.launcher.plan import JobOptions, JobPlan, plan_job, release_plan
from tfdist.launcher.process import ProcessGroup


def _log(message: str) -> None:
    print(f"[tfdist-launch] {message}", file=sys.stderr, flush=True)


def _exit_status(returncode: int) -> int:
    """A task killed by signal N reports -N; a shell reports 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def run_plan(plan: JobPlan, *, timeout: float, log_dir: str | None = None) -> int:
    """Starts every task of ``plan`` and waits for the job.

    Returns:
        0 on success, else the exit status of the first task that failed (124 on timeout).
    """
    for line in plan.describe():
        _log(f"task {json.dumps(line)}")
    group = ProcessGroup(log_dir=log_dir)
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        for task in plan.tasks:
            group.start(task.name, task.command, env={**os.environ, **dict(task.env)}, kind=task.kind)
        group.wait(timeout=timeout)
        _log(f"job finished: {len(plan.tasks)} task(s) succeeded")
        return 0
    except TaskFailedError as err:
        _log(f"task {err.task} failed first (exit status {err.returncode}); every task stopped. "
             f"Its last lines:\n{err.output_tail}")
        return _exit_status(err.returncode) or 1
    except TaskTimeoutError as err:
        _log(str(err))
        return 124
    except KeyboardInterrupt:
        _log("interrupted; stopping every task")
        return 130
    finally:
        group.stop()
        signal.signal(signal.SIGTERM, previous)
        release_plan(plan)


_NOT_RESTARTED = (0, 124, 130)  # success, timeout, interrupted by the user


def run_job(
    options: JobOptions, plan: JobPlan, *, max_restarts: int = 0, log_dir: str | None = None
) -> int:
    """Runs ``plan``; after a task failure, restarts the whole gang up to ``max_restarts`` times.

    Each restart gets a fresh plan (new free ports): a half-dead job cannot train, and the old
    ports may still be in TIME_WAIT. Scripts resume from their ``BackupAndRestore`` backup.
    """
    status = run_plan(plan, timeout=options.timeout, log_dir=log_dir)
    for attempt in range(1, max_restarts + 1):
        if status in _NOT_RESTARTED:
            break
        _log(f"restarting the whole job ({attempt}/{max_restarts}) after exit status {status}")
        status = run_plan(plan_job(options), timeout=options.timeout, log_dir=log_dir)
    return status


def _raise_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
