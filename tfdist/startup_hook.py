"""The start-up hook: the Keras 3 shims in every task ``tfdist-launch`` starts, tfdist or not.

A script written for TensorFlow alone (TensorFlow's "Multi-worker training with Keras" tutorial
makes its own ``tf.distribute.MultiWorkerMirroredStrategy()`` and calls ``model.fit``) never
creates a tfdist strategy, so nothing would install the shims of `tfdist.compat.KERAS3_SHIMS`
and Keras 3 would fail as released (keras#20585). The launcher therefore puts `HOOK_DIR` first
on every task's ``PYTHONPATH`` (`task_env`, read by `tfdist.launcher.plan`). That directory holds
one ``sitecustomize.py``, which Python runs at start-up. It:

1. runs the ``sitecustomize`` it hides (the next one on ``sys.path``), so a site's own hook
   still runs;
2. calls `arm`: a ``sys.meta_path`` finder waits for ``keras`` or ``tensorflow`` to be imported
   (nothing of TensorFlow or Keras is imported at start-up, so a task that never uses them pays
   nothing), and once the outermost of those imports has finished, runs the `KERAS_HOOKS`:
   `tfdist.compat.install_keras3_shims`, which applies the shims only under Keras 3 and only
   while the installed Keras still has the bugs, then `tfdist.kdist.install`, which makes
   Keras's own distribution API (``keras.distribution``) real on the TensorFlow backend.

``import tfdist`` arms the second alone (`arm` with ``hooks``), for a process that no launcher
started.

Both also register `stop_coordinator_threads` to run at exit (`guard_exit`): a parameter-server
coordinator's worker threads are daemon threads that run TensorFlow's C++ with the GIL released;
one that returns from C++ while the interpreter finalizes is ended by ``pthread_exit``, which
aborts the process ("terminate called after throwing an instance of ''", "FATAL: exception
not rethrown", exit status -6) after a job that trained to its end. Seen once in CI on
TensorFlow's parameter-server guide under tf-keras and once in the quick benchmark. The handler
stops each coordinator's cluster (as its ``__del__`` would) and joins those threads first.

``TFDIST_STARTUP_HOOK=off`` (in the launcher's environment) leaves the directory off the tasks'
``PYTHONPATH``; ``TFDIST_KERAS_SHIMS=off`` turns the shims off wherever they would be installed,
``TFDIST_KERAS_DISTRIBUTION=off`` leaves ``keras.distribution`` as Keras ships it.
A failure inside the hook is reported on stderr and never breaks the script's own import.
The names the hidden ``sitecustomize`` defines stay importable (``from sitecustomize import X``).

Its cost: about 0.1 CPU-s at each task's start (importing ``tfdist`` to arm the watcher;
measured 0.14 CPU-s a start against 0.04 for ``python -c pass``, ten starts each on a loaded
2-core machine); ``TFDIST_STARTUP_HOOK=off`` saves it for a job that needs no shims.

Example:
    >>> env = task_env({"PYTHONPATH": "/src"})
    >>> env["PYTHONPATH"].split(os.pathsep) == [str(HOOK_DIR), "/src"]
    True
    >>> task_env({"TFDIST_STARTUP_HOOK": "off"})
    {}
"""

from __future__ import annotations

import atexit
import importlib.abc
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["HOOK_DIR", "HOOK_ENV", "KERAS_HOOKS", "arm", "guard_exit", "hook_enabled",
           "stop_coordinator_threads", "task_env"]

HOOK_DIR = Path(__file__).resolve().parent / "_startup"
"""The directory put first on a task's PYTHONPATH (its ``sitecustomize.py`` ships in the wheel)."""

HOOK_ENV = "TFDIST_STARTUP_HOOK"
"""Set to ``off`` in the launcher's environment: tasks start without the hook."""

KERAS_HOOKS: tuple[str, ...] = ("tfdist.compat:install_keras3_shims", "tfdist.kdist:install")
"""What runs once Keras 3 (TensorFlow backend) is imported, in order, as ``module:function``
(named, not imported: this module sits below both in tfdist's layers)."""

_WATCHED = ("keras", "tensorflow")
_TRAINER = "keras.src.backend.tensorflow.trainer"


_OFF = ("off", "0", "false", "no")
_ON = ("", "on", "1", "true", "yes")


def hook_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """False when `HOOK_ENV` is ``off`` (or ``0``/``false``/``no``), True when unset or ``on``
    (``1``/``true``/``yes``).

    Raises:
        StrategyConfigError: any other value (a misspelling once left the hook on silently).

    Example:
        >>> hook_enabled({"TFDIST_STARTUP_HOOK": "0"}), hook_enabled({})
        (False, True)
    """
    env = os.environ if environ is None else environ
    value = env.get(HOOK_ENV, "").strip().lower()
    if value in _OFF or value in _ON:
        return value not in _OFF
    from tfdist.errors import StrategyConfigError, format_error

    raise StrategyConfigError(format_error(
        f"{HOOK_ENV} says whether the launched tasks get tfdist's start-up hook.",
        received=f"{HOOK_ENV}={env[HOOK_ENV]!r}", expected=f"one of {_OFF + _ON[1:]}",
        fix=f"set {HOOK_ENV}=off to start the tasks without it, or unset it"))


def task_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{"PYTHONPATH": ...}`` for a launched task: `HOOK_DIR`, then ``environ``'s own entries,
    an empty one (the current directory, to Python) kept.

    Empty when the hook is off (`hook_enabled`).

    Example:
        >>> task_env({"PYTHONPATH": ":/src"})["PYTHONPATH"].split(os.pathsep)[1:]
        ['', '/src']
    """
    env = os.environ if environ is None else environ
    if not hook_enabled(env):
        return {}
    hook = str(HOOK_DIR)
    given = env.get("PYTHONPATH", "")
    rest = [p for p in given.split(os.pathsep) if p != hook] if given else []
    return {"PYTHONPATH": os.pathsep.join([hook, *rest])}


class _KerasImportWatcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of ``keras``/``tensorflow`` so that, once the
    outermost of their imports has run, the shims are installed (see the module docstring)."""

    def __init__(self, hooks: Sequence[str]) -> None:
        self.depth = 0
        self.hooks = list(hooks)

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> Any:
        if name not in _WATCHED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    self._wrap(spec.loader)
                return spec
        return None

    def _wrap(self, loader: Any) -> None:
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            self.depth += 1
            try:
                run(module)
            finally:
                self.depth -= 1
            if self.depth == 0:
                self.loaded()

        loader.exec_module = exec_module

    def loaded(self) -> None:
        if _TRAINER not in sys.modules:  # tf-keras, or Keras on another backend: nothing to do
            return
        disarm()
        for target in self.hooks:
            _run(target)


def _run(target: str) -> None:
    """Runs hook ``module:function``; a failure is reported, never raised."""
    import importlib

    module, _, function = target.partition(":")
    try:
        getattr(importlib.import_module(module), function)()
    except Exception as err:  # noqa: BLE001 - never break the script's own import
        print(f"tfdist start-up hook: {target} was not installed: {err!r}", file=sys.stderr)


def arm(hooks: Sequence[str] = KERAS_HOOKS) -> None:
    """Runs ``hooks`` (default `KERAS_HOOKS`) now if Keras is already imported, else when it
    is (once each); registers the exit guard (`guard_exit`)."""
    guard_exit()
    for finder in sys.meta_path:
        if isinstance(finder, _KerasImportWatcher):
            finder.hooks += [h for h in hooks if h not in finder.hooks]
            return
    watcher = _KerasImportWatcher(hooks)
    if _TRAINER in sys.modules:
        watcher.loaded()
        return
    sys.meta_path.insert(0, watcher)


def disarm() -> None:
    """Removes the import watcher (`arm`'s), if any."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _KerasImportWatcher)]


COORDINATOR_THREADS = ("WorkerClosureProcessingLoop-", "WorkerPreemptionHandler")
"""Name prefixes of the daemon threads TensorFlow's ``ClusterCoordinator`` starts."""


def stop_coordinator_threads(timeout_s: float = 10.0) -> list[str]:
    """Stops every ``ClusterCoordinator``'s cluster in this process and joins its threads.

    A closure still running is let finish (within ``timeout_s`` in all); nothing is done in a
    process that never imported TensorFlow's coordinator.

    Returns:
        The names of the coordinator threads still alive after ``timeout_s``.

    Example:
        >>> stop_coordinator_threads()
        []
    """
    if "tensorflow.python.distribute.coordinator.cluster_coordinator" not in sys.modules:
        return []
    threads = [t for t in threading.enumerate() if t.name.startswith(COORDINATOR_THREADS)]
    clusters = {}
    for thread in threads:  # Worker._process_queue -> Worker -> its Cluster
        worker = getattr(getattr(thread, "_target", None), "__self__", None)
        cluster = getattr(worker, "_cluster", None)
        if cluster is not None and hasattr(cluster, "stop"):
            clusters[id(cluster)] = cluster
    for cluster in clusters.values():
        try:
            cluster.stop()
        except Exception as err:  # noqa: BLE001 - exiting; say it and go on
            print(f"tfdist: stopping a parameter-server coordinator at exit: {err!r}",
                  file=sys.stderr)
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in threads if t.is_alive()]


_exit_guarded = False


def guard_exit() -> None:
    """Registers `stop_coordinator_threads` to run at interpreter exit (once)."""
    global _exit_guarded
    if not _exit_guarded:
        _exit_guarded = True
        atexit.register(stop_coordinator_threads)
