"""Horovod's build checks, run once per test session instead of in every ``horovodrun``.

Before it starts the ranks, ``horovodrun`` asks whether Horovod was built with Gloo (and with
MPI): ``horovod.common.util._check_extension_lambda`` forks a child that imports
``horovod.tensorflow``, so TensorFlow, to read the answer. Two such children per launch,
about 3.5 CPU-s each with the suite's lean Keras (11 CPU-s at load 19 without it), none of it in
the census (forked children that end with ``os._exit``): the suite starts horovodrun 30-40
times. The build does not change during a session, so, in the suite's processes
(``sitecustomize.py`` calls `install` in a ``horovodrun`` started with ``TFDIST_TEST_WARM_DIR``
set), the first horovodrun of the session runs each check for real and records its answer in
that folder; later ones read it. Only the answer is shared: every check still ran once, in a
real child, on this session's Horovod.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from typing import Any

CACHE_FILE = "horovod-checks.json"


def install(session_dir: str) -> None:
    """Wraps Horovod's extension check in this process with the session's record of answers."""
    from horovod.common import util

    original = util._check_extension_lambda  # noqa: SLF001
    util._check_extension_lambda = recorded(original, os.path.join(session_dir, CACHE_FILE))


def recorded(check: Callable[..., Any], path: str) -> Callable[..., Any]:
    """``check(ext_base_name, fn, fn_desc, verbose)``, answered from ``path`` when a process of
    the session has run it for that extension and question (``fn_desc``); else run and kept.

    Example:
        >>> import tempfile
        >>> calls = []
        >>> def check(ext, fn, desc, verbose):
        ...     calls.append(ext)
        ...     return True
        >>> path = tempfile.mkdtemp() + "/checks.json"
        >>> [recorded(check, path)("tensorflow", None, "built with Gloo", False) for _ in "ab"]
        [True, True]
        >>> calls
        ['tensorflow']
    """

    def answer(ext_base_name: str, fn: Any, fn_desc: str, verbose: bool) -> Any:
        key = f"{ext_base_name}: {fn_desc}"
        with open(path + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one process runs a check, the others wait
            answers = _read(path)
            if key not in answers:
                answers[key] = check(ext_base_name, fn, fn_desc, verbose)
                with open(path + ".tmp", "w") as out:
                    json.dump(answers, out)
                os.replace(path + ".tmp", path)
        return answers[key]

    return answer


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path) as recorded_answers:
            return json.load(recorded_answers)
    except (OSError, ValueError):
        return {}
