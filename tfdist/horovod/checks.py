"""Checks that stop a Horovod job before it trains: ranks missing, a controller not built.

Two mistakes make Horovod train wrongly or not at all, and both are cheap to see early:

* No ranks. ``hvd.size() == 1`` is Horovod's normal single-process mode, so a Horovod script
  started without a Horovod launcher trains alone, silently; when every process of a larger job
  does that, they all train the same model apart. `ranks_problem` compares Horovod's size with what
  the environment says about the job (``TF_CONFIG``'s tasks, an MPI launcher's world size);
  `tfdist.horovod.init` raises it.
* A controller Horovod was built without. ``horovodrun --mpi`` needs Horovod built with MPI,
  ``--gloo`` with Gloo. `check_controller` reads the names in Horovod's compiled op library (no
  TensorFlow import: milliseconds); only when that does not show the controller does it ask
  Horovod itself (``horovod.common.util``, a child process that imports TensorFlow), so a refusal
  always rests on Horovod's own answer. ``tfdist-launch`` calls it before starting ``horovodrun``.

Example:
    >>> "Fix: launch with `tfdist-launch --strategy horovod --workers 2" in ranks_problem(
    ...     1, {"OMPI_COMM_WORLD_SIZE": "2"})
    True
"""

from __future__ import annotations

import importlib
import importlib.util
import struct
from collections.abc import Mapping
from pathlib import Path

from tfdist.core.environ import peek_tf_config
from tfdist.errors import MissingDependencyError, StrategyConfigError, format_error

__all__ = [
    "CONTROLLERS",
    "INSTALL_FIX",
    "check_installed",
    "WORLD_SIZE_VARIABLES",
    "job_size",
    "ranks_problem",
    "op_library",
    "built_in_library",
    "built_per_horovod",
    "controller_problem",
    "check_controller",
]

CONTROLLERS = ("gloo", "mpi")
"""The controllers ``horovodrun`` can start ranks with (``--gloo``, ``--mpi``)."""

WORLD_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")
"""Set by MPI launchers (Open MPI, MPICH/Intel MPI, PMIx) to the number of processes started."""

_SYMBOLS = {"mpi": b"libmpi", "gloo": b"GlooContext"}
"""What Horovod's op library names when built with each controller: it needs libmpi for MPI,
and Horovod's Gloo context class exists only in a build with Gloo."""


INSTALL_FIX = (
    "build it into this environment: `make horovod` in the tfdist checkout (it runs `bash "
    "launch/setup.sh`; `make main` sets up without Horovod). Horovod 0.28.1 needs a patched build "
    "for TensorFlow 2.21: seconds from the wheel cached in ~/.cache/tfdist, else 3-5 minutes. "
    "Then check it with `tfdist-launch --check`"
)
"""How to get Horovod, for every error that finds it missing."""

_NAMES = {"mpi": ("MPI", "--mpi"), "gloo": ("Gloo", "without --mpi")}
_FIXES = {
    "mpi": "drop --mpi to use Gloo, or rebuild Horovod with MPI: apt-get install openmpi-bin "
    "libopenmpi-dev, then bash launch/setup.sh (it builds MPI in where mpicxx is found)",
    "gloo": "pass --mpi to use MPI, or rebuild Horovod with Gloo: bash launch/setup.sh (Gloo "
    "needs cmake), then check it with horovodrun --check-build",
}


def job_size(environ: Mapping[str, str]) -> tuple[int, str]:
    """How many processes the environment says this job has, and which variable says so.

    Example:
        >>> job_size({"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:1"]}, '
        ...           '"task": {"type": "worker", "index": 1}}'})
        (2, 'TF_CONFIG with 2 tasks (this one worker:1)')
        >>> job_size({})
        (1, 'no TF_CONFIG and no MPI world size')
    """
    view = peek_tf_config(environ)
    if view is not None:
        tasks = sum(view.count(role) for role in view.roles)
        if tasks > 1:
            this = f"{view.task_type}:{view.task_index}"
            return tasks, f"TF_CONFIG with {tasks} tasks (this one {this})"
    for name in WORLD_SIZE_VARIABLES:
        value = environ.get(name, "").strip()
        if value.isdigit() and int(value) > 1:
            return int(value), f"{name}={value}"
    return 1, "no TF_CONFIG and no MPI world size"


def ranks_problem(size: int, environ: Mapping[str, str]) -> str | None:
    """The error for a process that Horovod sees alone in a job of several, else None.

    Example:
        >>> ranks_problem(1, {}) is None  # one process, on purpose: Horovod's normal mode
        True
        >>> ranks_problem(2, {"OMPI_COMM_WORLD_SIZE": "2"}) is None
        True
    """
    expected, received = job_size(environ)
    if size != 1 or expected == 1:
        return None
    return format_error(
        f"Horovod has no ranks: this process trains alone (hvd.size() == 1), but it is one of "
        f"{expected} processes, each of which would train its own model.",
        received=received,
        expected="Horovod ranks, started by horovodrun, tfdist-launch --strategy horovod, or "
        "mpirun with a Horovod built with MPI",
        fix=f"launch with `tfdist-launch --strategy horovod --workers {expected} script.py` (or "
        f"`horovodrun -np {expected} python script.py`); under another strategy's launch use "
        "that strategy (tfdist.get_strategy('auto')) instead of Horovod; under mpirun, build "
        "Horovod with MPI (apt-get install openmpi-bin libopenmpi-dev, then bash launch/setup.sh)",
    )


def op_library() -> Path | None:
    """Horovod's compiled TensorFlow op library, found without importing Horovod.

    Example:
        >>> op_library().name.startswith("mpi_lib")
        True
    """
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder, "tensorflow").glob("mpi_lib*.so"))
        if found:
            return found[0]
    return None


def _dynamic_strings(path: Path) -> bytes:
    """An ELF64 file's ``.dynstr``: the libraries it needs and its dynamic symbols' names."""
    with path.open("rb") as file:
        header = file.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2:
            raise ValueError(f"{path} is not a 64-bit ELF file")
        order = "<" if header[5] == 1 else ">"
        (table_offset,) = struct.unpack_from(order + "Q", header, 0x28)
        entry_size, count, names_index = struct.unpack_from(order + "HHH", header, 0x3A)
        file.seek(table_offset)
        table = file.read(entry_size * count)
        # Each section header starts with: name, type, flags, address, offset, size.
        sections = [struct.unpack_from(order + "IIQQQQ", table, i * entry_size)
                    for i in range(count)]

        def read(section: tuple[int, ...]) -> bytes:
            file.seek(section[4])
            return file.read(section[5])

        names = read(sections[names_index])
        for section in sections:
            if names[section[0]:names.index(b"\0", section[0])] == b".dynstr":
                return read(section)
    raise ValueError(f"{path} has no .dynstr section")


def built_in_library(controller: str, library: Path | None = None) -> bool | None:
    """Whether ``library`` (default: `op_library`) names ``controller``; None if unreadable.

    Example:
        >>> built_in_library("gloo")  # this environment's build
        True
    """
    library = library or op_library()
    if library is None:
        return None
    try:
        return _SYMBOLS[controller] in _dynamic_strings(library)
    except (OSError, ValueError, struct.error):
        return None


def built_per_horovod(controller: str) -> bool | None:
    """Horovod's own answer (``gloo_built()``/``mpi_built()``, which import TensorFlow in a
    child process: seconds); None when Horovod is not installed."""
    try:
        util = importlib.import_module("horovod.common.util")
    except ImportError:
        return None
    built = util.mpi_built() if controller == "mpi" else util.gloo_built()
    return None if built is None else bool(built)


def controller_problem(controller: str, built: bool | None) -> str | None:
    """The error for asking ``horovodrun --<controller>`` of a Horovod built without it.

    Example:
        >>> controller_problem("mpi", True) is None, controller_problem("gloo", None) is None
        (True, True)
        >>> controller_problem("mpi", False).split(" Received")[0]
        'tfdist-launch --mpi runs horovodrun --mpi, but this Horovod was built without MPI.'
    """
    if built is not False:
        return None
    name, flag = _NAMES[controller]
    return format_error(
        f"tfdist-launch {flag} runs horovodrun --{controller}, but this Horovod was built "
        f"without {name}.",
        received=f"{flag}, and Horovod's {controller}_built() is False",
        expected=f"a Horovod built with {name} (see tfdist-launch --check)",
        fix=_FIXES[controller],
    )


def check_installed() -> None:
    """Raises `MissingDependencyError` naming the command that builds Horovod when it is not
    installed (no import: milliseconds).

    Example:
        >>> check_installed()  # this environment has it
    """
    if importlib.util.find_spec("horovod") is None:
        raise MissingDependencyError(format_error(
            "--strategy horovod starts its ranks with horovodrun, but Horovod is not installed "
            "in this environment.",
            received="no importable horovod package",
            expected="Horovod 0.28.1 built with TensorFlow and Gloo (or MPI)",
            fix=INSTALL_FIX))


def check_controller(controller: str, library: Path | None = None) -> None:
    """Raises `StrategyConfigError` when Horovod was built without ``controller``, and
    `MissingDependencyError` (`check_installed`) when it is not installed at all.

    Asks Horovod itself only when the op library does not show the controller.

    Example:
        >>> check_controller("gloo")  # built with Gloo: no error, no TensorFlow import
    """
    check_installed()
    built = built_in_library(controller, library)
    if not built:
        built = built_per_horovod(controller)
    problem = controller_problem(controller, built)
    if problem:
        raise StrategyConfigError(problem)

