"""Run a script once per task of a real local cluster, for tests and experiments.

The shape of TensorFlow's ``multi_process_runner``: one OS process per task, each with its own
``TF_CONFIG`` on free loopback ports, a timeout on the whole job, a child's failure re-raised with
the task's name, and every child killed on the way out. Each task reports a JSON-serialisable
result with `report`; `run_cluster` returns them by task name.

Example:
    A script ``train.py`` that ends with ``tfdist.testing.report({"loss": loss})`` runs as::

        spec = tfdist.ClusterSpec.local(workers=2)
        results = tfdist.testing.run_cluster(spec, "train.py", timeout=120)
        results["worker:1"]["loss"]
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from tfdist.core.detect import RANK_VARIABLES, launch_strategy
from tfdist.core.environ import peek_tf_config
from tfdist.core.registry import strategy_traits
from tfdist.core.traits import TaskKind
from tfdist.errors import LaunchError
from tfdist.launcher.process import ProcessGroup

if TYPE_CHECKING:
    from tfdist.cluster import ClusterSpec

__all__ = [
    "report",
    "exit_after_report",
    "run_cluster",
    "run_tasks",
    "task_name",
    "alive",
    "wait_gone",
    "RESULT_DIR_ENV",
]

RESULT_DIR_ENV = "TFDIST_RESULT_DIR"


def task_name(environ: Mapping[str, str] | None = None) -> str:
    """This process's task as ``"type:index"``: from TF_CONFIG, a Horovod/MPI rank, else
    ``"chief:0"`` (a single-process job is its own chief, as the launcher names it).

    Example:
        >>> task_name({"TF_CONFIG": '{"cluster": {}, "task": {"type": "worker", "index": 1}}'})
        'worker:1'
        >>> task_name({"PMIX_RANK": "3"}), task_name({})
        ('rank:3', 'chief:0')
    """
    env = os.environ if environ is None else environ
    view = peek_tf_config(env)
    if view is not None:
        return f"{view.task_type or 'worker'}:{view.task_index}"
    for rank_var in RANK_VARIABLES:
        if rank_var in env:
            return f"rank:{env[rank_var]}"
    return "chief:0"


def report(result: Any) -> None:
    """Records this task's result for `run_cluster` (no-op outside of it).

    Args:
        result: Anything ``json.dumps`` accepts (numpy arrays: call ``.tolist()`` first).
    """
    out_dir = os.environ.get(RESULT_DIR_ENV)
    if not out_dir:
        return
    path = Path(out_dir) / f"{task_name().replace(':', '_')}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(path)


def exit_after_report(linger: float = 0.5) -> NoReturn:
    """Ends a task once it has reported: its exit handlers run (tfdist's exit barrier,
    Horovod's shutdown), then it leaves without Python's teardown of its modules and traced
    graphs, which nobody reads: 1.5 CPU-s of a TensorFlow task's exit (4 tasks of
    ``tests/multiprocess/scripts/tensor_parity.py``: 1.45-1.66 CPU-s from the script's end to
    the exit, 0.10-0.12 with this).

    Args:
        linger: seconds to wait first, without CPU: a peer may still be reading this process's
            part of the last collective, which it serves until it exits.

    Example:
        A task script ends with::

            tfdist.testing.report(result)
            tfdist.testing.exit_after_report()
    """
    atexit._run_exitfuncs()
    time.sleep(linger)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_tasks(
    commands: Mapping[str, Sequence[str]],
    *,
    env: Mapping[str, Mapping[str, str]] | None = None,
    kinds: Mapping[str, TaskKind] | None = None,
    timeout: float = 120.0,
    stream: Any = None,
    result_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Runs one process per named command and returns each task's reported result.

    Args:
        commands: Task name -> argv.
        env: Task name -> extra environment variables for that task.
        kinds: Task name -> ``"main"`` (default), ``"service"`` or ``"sidecar"``.
        timeout: Seconds for the whole job.
        stream: Where prefixed output goes (default stdout).
        result_dir: Where results are exchanged (default: a temporary directory).

    Returns:
        Task name -> the object that task passed to `report` (tasks that did not report are absent).

    Raises:
        TaskFailedError: A task failed (its name, status and last lines are in the message).
        TaskTimeoutError: The job ran past ``timeout``.
    """
    with tempfile.TemporaryDirectory(prefix="tfdist-results-") as tmp:
        out_dir = Path(result_dir) if result_dir is not None else Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        with ProcessGroup(stream=stream) as group:
            for name, argv in commands.items():
                task_env = {**os.environ, **(env or {}).get(name, {}), RESULT_DIR_ENV: str(out_dir)}
                group.start(name, argv, env=task_env, kind=(kinds or {}).get(name, "main"))
            group.wait(timeout=timeout)
        return _collect(out_dir)


def _collect(out_dir: Path) -> dict[str, Any]:
    paths = sorted(out_dir.glob("*.json"))
    return {_rejoin(path.stem): json.loads(path.read_text()) for path in paths}


def _rejoin(stem: str) -> str:
    role, _, index = stem.rpartition("_")
    return f"{role}:{index}" if role else stem


def run_cluster(
    spec: ClusterSpec,
    script: str | os.PathLike[str],
    args: Iterable[str] = (),
    *,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    strategy: str | None = None,
    stream: Any = None,
) -> dict[str, Any]:
    """Runs ``script`` once per task of ``spec``, each with its own TF_CONFIG.

    What each task runs comes from the strategy's traits, as in ``tfdist-launch``: with
    ``parameter_server`` (the default when ``spec`` has ps tasks) only the chief runs ``script``;
    ``ps`` and ``worker`` tasks run ``python -m tfdist.server`` and are stopped when the chief is
    done; an evaluator runs ``script`` as a sidecar. Otherwise every task runs ``script``.
    Each task gets the variables the strategy's tasks need (``traits.env``) below ``env``.

    Args:
        strategy: Whose traits to follow (default: ``auto`` for the spec's role counts).

    Returns:
        Task name (``"worker:1"``) -> that task's reported result.
    """
    if not Path(script).exists():
        raise LaunchError(f"Script not found. Received: {script}. Fix: pass an existing file.")
    trainers = len(spec.worker) + len(spec.chief)
    traits = strategy_traits(strategy or launch_strategy(workers=trainers, ps=len(spec.ps)))
    commands: dict[str, tuple[str, ...]] = {}
    task_env: dict[str, dict[str, str]] = {}
    kinds: dict[str, TaskKind] = {}
    for task in spec.tasks():
        name = str(task)
        commands[name] = traits.task_argv(task.type, (os.fspath(script), *args))
        kinds[name] = traits.task_kind(task.type)
        task_env[name] = {**traits.env, **(env or {}),
                          "TF_CONFIG": spec.tf_config_json(task.type, task.index)}
    return run_tasks(commands, env=task_env, kinds=kinds, timeout=timeout, stream=stream)


def alive(pids: Iterable[int]) -> list[int]:
    """The processes among ``pids`` that are still running (a zombie counts as gone).

    Needs psutil (in tfdist's ``test`` extra).

    Example:
        >>> alive([os.getpid()]) == [os.getpid()]
        True
    """
    import psutil

    running = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
        except psutil.NoSuchProcess:
            pass
    return running


def wait_gone(pids: Iterable[int], timeout: float = 10.0) -> list[int]:
    """Waits up to ``timeout`` seconds for every process in ``pids`` to end.

    Returns:
        Those still running at the deadline: ``[]`` when every one is gone.

    Example:
        >>> wait_gone([], timeout=1)
        []
    """
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while (running := alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return running
