"""The test suite's start-up knobs: lean Keras 3, the process census, warm starts.

Python imports this module at start-up in every process whose path holds this checkout (the
tests start their children with ``PYTHONPATH=<checkout>``). It does nothing unless
``TFDIST_TEST_LEAN_KERAS=1`` (``tests/conftest.py`` sets it for the processes the suite starts).

Why: ``import tensorflow`` imports Keras 3, whose ``keras.wrappers`` (the scikit-learn estimator
wrappers) imports scikit-learn (and SciPy), and whose ``keras.visualization`` imports
``matplotlib.pyplot``, whenever they are installed (the ``test`` extra installs them): about 1.5 of
the 4.4 CPU-seconds of the import, paid by every task process of every multi-process test. With
the knob set, each is hidden from that Keras package only: Keras then defines those functions as it
does without them (unusable, and no test uses them), and any other import of them (the examples
load data and score with scikit-learn, the benchmark plots) works as usual.

The suite's process census: with ``TFDIST_TEST_PROCESS_LOG=<file>`` (``tests/conftest.py`` sets
it), each process appends one line when it starts (its command line and the test running,
``PYTEST_CURRENT_TEST``) and one when it exits normally (its CPU-seconds, and whether it imported
TensorFlow; a warm server adds a ``reaped`` line with the CPU of each task it forked, however it
ended), so the run's summary can say how many processes the suite started and which tests' cost
most (set it yourself to keep the file).

Warm starts: with ``TFDIST_TEST_WARM_DIR`` (``tests/conftest.py`` sets it), a task process hands
itself to a server that has already imported TensorFlow and is forked from it
(``tests/warm_start.py`` says which processes, how, and what differs); and a ``horovodrun``
answers Horovod's build checks from the session's record (``tests/horovod_checks.py``).
"""

from __future__ import annotations

import os
import sys

LEAN_KERAS_ENV = "TFDIST_TEST_LEAN_KERAS"
HIDDEN = {"sklearn": "keras.src.wrappers", "matplotlib": "keras.src.visualization"}
"""Top-level package -> the Keras package it is hidden from."""


class _HideFromKeras:
    """A `sys.meta_path` finder: a `HIDDEN` package imported from its Keras package is not found."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        importer = HIDDEN.get(name)
        if importer is not None and _imported_from(importer):
            raise ModuleNotFoundError(f"{LEAN_KERAS_ENV}=1 hides {name} from {importer}",
                                      name=name)
        return None  # every other import: the next finder decides


def _imported_from(package: str, depth: int = 40) -> bool:
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return False
        if frame.f_globals.get("__name__", "").startswith(package):
            return True
        frame = frame.f_back
    return False


PROCESS_LOG_ENV = "TFDIST_TEST_PROCESS_LOG"


def _census(path: str) -> None:
    """Appends this process's start line now and its exit line at exit (JSON lines)."""
    import atexit

    census_start()
    atexit.register(_census_exit, path)


def _census_append(path: str, kind: str, **fields: object) -> None:
    import json

    try:
        with open(path, "a") as log:
            log.write(json.dumps({"kind": kind, "pid": os.getpid(), **fields}) + "\n")
    except OSError:
        pass  # a census line is never worth a failure


def census_start(warm: bool = False) -> None:
    """The start line (a warm-started task, forked by ``tests/warm_start.py``, writes its own)."""
    path = os.environ.get(PROCESS_LOG_ENV)
    if path:
        _census_append(path, "start", argv=[str(a) for a in getattr(sys, "orig_argv", [])[:6]],
                       warm=warm, test=os.environ.get("PYTEST_CURRENT_TEST", ""))


def _census_exit(path: str) -> None:
    times = os.times()  # a forked child's count starts at the fork
    _census_append(os.environ.get(PROCESS_LOG_ENV) or path, "exit",
                   cpu=times.user + times.system, tensorflow="tensorflow" in sys.modules)


WARM_DIR_ENV = "TFDIST_TEST_WARM_DIR"


def _warm_start_or_return() -> None:
    """Hands this process to a warm server (``tests/warm_start.py``) if it is a task it can run."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests", "warm_start.py")
    spec = importlib.util.spec_from_file_location("tfdist_test_warm_start", path)
    if spec is None or spec.loader is None or not os.path.exists(path):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.shim_or_return()


def _record_horovod_checks() -> None:
    """In ``horovodrun``: Horovod's build checks answered once per session
    (``tests/horovod_checks.py``)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests", "horovod_checks.py")
    spec = importlib.util.spec_from_file_location("tfdist_test_horovod_checks", path)
    if spec is None or spec.loader is None or not os.path.exists(path):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.install(os.environ[WARM_DIR_ENV])
    except ImportError:
        pass  # no Horovod: horovodrun says so itself


if os.environ.get(WARM_DIR_ENV) and any(  # a cheap look before importing anything
        arg == "-m" or arg.endswith(".py") for arg in getattr(sys, "orig_argv", [])[1:4]):
    _warm_start_or_return()
if os.environ.get(WARM_DIR_ENV) and os.path.basename(
        (getattr(sys, "orig_argv", []) + ["", ""])[1]) == "horovodrun":
    _record_horovod_checks()
if os.environ.get(LEAN_KERAS_ENV) == "1":
    sys.meta_path.insert(0, _HideFromKeras())
    if os.environ.get(PROCESS_LOG_ENV):
        _census(os.environ[PROCESS_LOG_ENV])
