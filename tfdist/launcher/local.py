"""Run a `JobPlan` on this machine: gang start, prefixed output, stop everything on failure.

Fault policy of a ParameterServer job: a ``worker`` task that dies is restarted alone (same
TF_CONFIG, same port) up to ``worker_restarts`` times while the chief's ``ClusterCoordinator``
carries on; a ``ps`` task that dies is fatal (its variables are gone) and stops the job. An
evaluator is a sidecar: its crash is reported and training goes on; once the training tasks are
done it gets up to ``sidecar_grace`` seconds (``--evaluator-grace``) to evaluate the last
checkpoint and exit, then it is stopped.
"""

from __future__ import annotations

import json
import signal
import sys
from types import FrameType

from tfdist.errors import TaskFailedError, TaskTimeoutError
from tfdist.launcher.plan import JobOptions, JobPlan, TaskPlan, plan_job, release_plan
from tfdist.launcher.process import ProcessGroup


def _log(message: str) -> None:
    print(f"[tfdist-launch] {message}", file=sys.stderr, flush=True)


def _exit_status(returncode: int) -> int:
    """A task killed by signal N reports -N; a shell reports 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def task_restarts(plan: JobPlan, task: TaskPlan, worker_restarts: int) -> int:
    """How many times ``task`` may be restarted alone: ParameterServer workers only.

    Example:
        >>> from tfdist.cluster import Task
        >>> plan = JobPlan("parameter_server", ())
        >>> task = TaskPlan("worker:1", Task("worker", 1), "localhost", None, ("python",))
        >>> task_restarts(plan, task, 3), task_restarts(JobPlan("multi_worker", ()), task, 3)
        (3, 0)
    """
    is_ps_worker = task.task is not None and task.task.type == "worker"
    return worker_restarts if plan.strategy == "parameter_server" and is_ps_worker else 0


def _failure_message(plan: JobPlan, err: TaskFailedError) -> str:
    if plan.strategy == "parameter_server" and err.task.startswith("ps:"):
        return (
            f"{err.task} died: parameter-server loss is fatal; its variables are gone. Restart "
            f"the job (--max-restarts N reruns it; with BackupAndRestore in the script, training "
            f"resumes from the last backup). Exit status {err.returncode}; every task stopped. "
            f"Its last lines:\n{err.output_tail}"
        )
    return (f"task {err.task} failed first (exit status {err.returncode}); every task stopped. "
            f"Its last lines:\n{err.output_tail}")


def run_plan(
    plan: JobPlan,
    *,
    timeout: float,
    log_dir: str | None = None,
    worker_restarts: int = 0,
    sidecar_grace: float = 0.0,
) -> int:
    """Starts every task of ``plan`` and waits for the job.

    Args:
        plan: The tasks to run.
        timeout: Seconds before every task is stopped.
        log_dir: If set, each task's output also goes to ``<log_dir>/<task>.log``.
        worker_restarts: How many times each ParameterServer ``worker`` is restarted alone.
        sidecar_grace: Seconds a sidecar (the evaluator) may run on once the main tasks are done.

    Returns:
        0 on success, else the exit status of the first task that failed (124 on timeout).
    """
    for line in plan.describe():
        _log(f"task {json.dumps(line)}")
    group = ProcessGroup(log_dir=log_dir, sidecar_grace=sidecar_grace)
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        for task in plan.tasks:
            started = group.start(
                task.name, task.command, env=task.environ(), kind=task.kind,
                max_restarts=task_restarts(plan, task, worker_restarts),
            )
            _log(f"started {task.name} (pid {started.pid})")
        group.wait(timeout=timeout)
        restarted = {t.name: t.restarts for t in group.tasks.values() if t.restarts}
        _log(f"job finished: {len(plan.tasks)} task(s) succeeded"
             + (f"; restarted alone: {restarted}" if restarted else ""))
        return 0
    except TaskFailedError as err:
        _log(_failure_message(plan, err))
        return _exit_status(err.returncode) or 1
    except TaskTimeoutError as err:
        _log(str(err))
        return 124
    except KeyboardInterrupt:
        _log("interrupted; stopping every task")
        return 130
    except OSError as err:  # a task could not be started: the gang starts whole or not at all
        _log(f"could not start every task ({err}); the ones already started were stopped")
        return 127
    finally:
        group.stop()
        signal.signal(signal.SIGTERM, previous)
        release_plan(plan)


_NOT_RESTARTED = (0, 124, 130)  # success, timeout, interrupted by the user


def run_job(
    options: JobOptions,
    plan: JobPlan,
    *,
    max_restarts: int = 0,
    log_dir: str | None = None,
    worker_restarts: int = 0,
) -> int:
    """Runs ``plan``; after a task failure, restarts the whole gang up to ``max_restarts`` times.

    Each restart gets a fresh plan (new free ports): a half-dead job cannot train, and the old
    ports may still be in TIME_WAIT. Scripts resume from their ``BackupAndRestore`` backup.
    ParameterServer workers are first restarted alone, up to ``worker_restarts`` times each.
    """
    run = dict(timeout=options.timeout, log_dir=log_dir, worker_restarts=worker_restarts,
               sidecar_grace=options.evaluator_grace)
    status = run_plan(plan, **run)
    for attempt in range(1, max_restarts + 1):
        if status in _NOT_RESTARTED:
            break
        _log(f"restarting the whole job ({attempt}/{max_restarts}) after exit status {status}")
        status = run_plan(plan_job(options), **run)
    return status


def _raise_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
