"""Shared fixtures: a multi-process cluster runner, marker-based skips and the run's timing.

Tests without a marker (``multiprocess``, ``horovod``, ``slow`` or ``docs``) are treated as
``unit``. ``horovod`` tests skip (with the reason) when
Horovod is not built; run ``bash launch/setup.sh`` to build it. Every run ends with its wall time,
the CPU cores and load it ran on, and its `SLOWEST` slowest tests (setup, call and teardown
together) and modules, also under ``pytest -n 2`` (pytest-xdist), where the per-phase
``--durations`` list mixes the two workers' phases. Every test's row of the CPU its processes
used (the summary shows the top 15): run with ``TFDIST_TEST_PROCESS_LOG=FILE`` (kept, not
deleted), then ``python tests/census.py FILE``.
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import os
import re
import shutil
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from census import process_census
from idle_cores import IdleCores, cpu_ticks

REPO_ROOT = Path(__file__).resolve().parent.parent

# Child processes must find the venv's tools (horovodrun) and import this checkout's tfdist.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Tests read every task's output (tfdist-launch --verbose); the tests of the launcher's default
# view (tests/multiprocess/test_launcher_output.py) unset it.
os.environ.setdefault("TFDIST_LAUNCH_VERBOSE", "1")
# The processes the suite starts import Keras 3 without scikit-learn (about 1 of 4.4 CPU-s per
# process; see sitecustomize.py, which Python runs in every child with this checkout on its path).
os.environ.setdefault("TFDIST_TEST_LEAN_KERAS", "1")
# ... and note their start and, at a normal exit, their CPU time (sitecustomize.py's census): the
# summary counts them. Set once, by the first pytest process (xdist's workers inherit it).
if "TFDIST_TEST_PROCESS_LOG" not in os.environ:
    _census_log = Path(os.environ.get("TMPDIR", "/tmp")) / f"tfdist-census-{os.getpid()}.jsonl"
    _census_log.unlink(missing_ok=True)
    os.environ["TFDIST_TEST_PROCESS_LOG"] = str(_census_log)


def compile_checkout(root: Path = REPO_ROOT) -> None:
    """Writes the bytecode of the checkout's own modules (tfdist/, tests/, sitecustomize.py).

    With ``PYTHONDONTWRITEBYTECODE=1`` in the environment (this machine's; CI's too where it
    runs on one like it) no process writes it, and in a fresh clone every process the suite
    starts compiled the tfdist modules it imports from source: 0.26-0.45 CPU-s for a task's 113
    (0.07-0.14 from bytecode, TensorFlow imported first), 0.18 CPU-s for a launcher process
    (0.11). test_multi_worker.py in two fresh clones, side by side: its 21 processes took 28.3
    and 24.2 CPU-s without this, 24.3 and 23.5 with it. Here: 0.9 CPU-s once (410 files), 0.01
    when nothing changed.
    """
    import compileall

    for folder in ("tfdist", "tests"):
        compileall.compile_dir(root / folder, quiet=2)
    compileall.compile_file(root / "sitecustomize.py", quiet=2)


if "PYTEST_XDIST_WORKER" not in os.environ:  # the controller (or a run without -n)
    compile_checkout()
# ... and task processes start warm: forked from a server that imported TensorFlow once
# (tests/warm_start.py; TFDIST_TEST_WARM=0 turns it off, the `cold_start` marker per test).
if "TFDIST_TEST_WARM_DIR" not in os.environ and os.environ.get("TFDIST_TEST_WARM", "1") != "0":
    import tempfile

    os.environ["TFDIST_TEST_WARM_DIR"] = tempfile.mkdtemp(prefix="tfdist-warm-", dir="/tmp")
    os.environ["TFDIST_TEST_WARM_OWNER"] = str(os.getpid())


SLOWEST = 15
SLOWEST_MODULES = 30
"""Modules listed by their tests' added durations: enough to see where the suite's time goes."""
_started = time.monotonic()
_load_at_start = os.getloadavg()


_ticks_at_start = cpu_ticks()
_seconds_by_test: defaultdict[str, float] = defaultdict(float)
_idle = IdleCores(os.cpu_count() or 1)


def _horovod_available() -> bool:
    return importlib.util.find_spec("horovod") is not None


NOT_UNIT = frozenset({"multiprocess", "horovod", "slow", "docs"})
"""The markers that keep a test out of ``unit`` (a test with none of them is a unit test)."""
_MODULE_MARKS = re.compile(r"^pytestmark\s*=\s*(\[[^\]]*\]|.*)$", re.MULTILINE)


def has_no_unit_test(source: str) -> bool:
    """Whether a test module's source keeps every test out of ``unit``: its own ``pytestmark``
    names a `NOT_UNIT` marker and no test is marked ``unit`` explicitly."""
    found = _MODULE_MARKS.search(source)
    marks = set(re.findall(r"pytest\.mark\.(\w+)", found.group(1)) if found else ())
    return bool(marks & NOT_UNIT) and "mark.unit" not in source


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m unit`` (make test-fast), a module without a unit test is not imported: each
    pytest-xdist worker imported all of them (about 80) only to deselect their tests."""
    if (config.getoption("markexpr", "").strip() != "unit" or collection_path.suffix != ".py"
            or not collection_path.name.startswith("test_")):
        return None
    return True if has_no_unit_test(collection_path.read_text(encoding="utf-8")) else None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Moves what importing and collecting made (TensorFlow's and Keras's modules, millions of
    objects) out of the garbage collector's sight: each full collection that the tests' models
    set off walked all of it again. tensor_plan + pipeline_model (-n 0, thread CPU inside the
    collector's callbacks): 2.58 s without, 1.74 s with (of 37 CPU-s)."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_horovod = pytest.mark.skip(reason="Horovod is not installed; run: bash launch/setup.sh")
    have_horovod = _horovod_available()
    for item in items:
        if not any(m.name in NOT_UNIT for m in item.iter_markers()):
            item.add_marker(pytest.mark.unit)
        if "horovod" in item.keywords and not have_horovod:
            item.add_marker(skip_horovod)
    if config.getoption("markexpr", "").strip() == "unit":
        # ``slow`` wins over a module's ``pytestmark = pytest.mark.unit``: a unit module's few
        # slow tests (seconds of training, a TF process or waiting) run in make test only.
        slow = [item for item in items if item.get_closest_marker("slow") is not None]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item not in slow]
    items[:] = _longest_first(items)


_SHARED_FIXTURE = re.compile(r"@pytest\.fixture\(\s*scope=[\"'](module|session)[\"']")


@functools.cache
def shared_fixture_modules() -> frozenset[str]:
    """The test modules (``tests/...py``, as in node ids) that define a module- or
    session-scoped fixture: a cluster, or a job launched once and read by several tests."""
    return frozenset(
        path.relative_to(REPO_ROOT).as_posix() for path in (REPO_ROOT / "tests").rglob("test_*.py")
        if _SHARED_FIXTURE.search(path.read_text(encoding="utf-8")))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``, one worker per module that has a shared fixture, set up once.

    pytest-xdist's own loadgroup (tests marked ``xdist_group``) does not group under pytest 9
    (its node-id suffix is lost), so this scheduler groups by module: the tests of a module in
    `shared_fixture_modules` form one unit, every other test is a unit of its own.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in shared_fixture_modules() else nodeid

    return SharedFixtureScheduling(config, log)


def _longest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The modules in the order that keeps both pytest-xdist workers busy to the end.

    First the modules with a shared fixture (they run in a row on one worker), then those with
    slow tests, then other multi-process ones, unit tests last (short ones fill the gaps). A
    module's tests stay together and in their order, so its module-scoped fixtures are set up
    once.
    """

    def rank(item: pytest.Item) -> int:
        if item.nodeid.split("::", 1)[0] in shared_fixture_modules():
            return 0
        marks = {m.name for m in item.iter_markers()}
        return next((r for r, name in enumerate(("slow", "multiprocess"), 1) if name in marks), 3)

    modules: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        modules[module] = min(modules.get(module, 3), rank(item))
    order = {module: position for position, module in
             enumerate(sorted(modules, key=lambda module: modules[module]))}
    return sorted(items, key=lambda item: order[item.nodeid.split("::", 1)[0]])


def pytest_configure(config: pytest.Config) -> None:
    """Refuses two test modules of one name anywhere under tests/, even in a one-file run.

    tests/ has no ``__init__.py``: pytest imports a test module by its file name, so a session
    that collects both (``make test``) stops with "import file mismatch" before any test runs,
    while each module run alone passes.
    """
    by_name: defaultdict[str, list[str]] = defaultdict(list)
    for path in (REPO_ROOT / "tests").rglob("test_*.py"):
        by_name[path.name].append(path.relative_to(REPO_ROOT).as_posix())
    clashes = sorted(paths for paths in by_name.values() if len(paths) > 1)
    if clashes:
        raise pytest.UsageError(
            f"test modules must have unique file names; received: {clashes}. Fix: rename one "
            "of each (make test collects them in one session).")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The warm servers of this session (tests/warm_start.py) end with it: no process is left."""
    import signal

    if os.environ.get("TFDIST_TEST_WARM_OWNER") != str(os.getpid()):
        return  # an xdist worker: the controller owns the servers
    warm_dir = Path(os.environ["TFDIST_TEST_WARM_DIR"])
    servers = []
    for pidfile in warm_dir.glob("*.pid"):
        try:
            servers.append(int(pidfile.read_text()))
            os.kill(servers[-1], signal.SIGTERM)  # a normal exit: the census counts its CPU
        except (ValueError, OSError):
            pass
    deadline = time.monotonic() + 5
    while any(map(_running, servers)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in servers:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    shutil.rmtree(warm_dir, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture(autouse=True, scope="module")
def _cold_start_module(request: pytest.FixtureRequest) -> Iterator[None]:
    """A module marked ``cold_start`` starts every task process cold (it tests the processes)."""
    yield from _cold_start_if(request.node.get_closest_marker("cold_start") is not None)


@pytest.fixture(autouse=True)
def _cold_start_test(request: pytest.FixtureRequest) -> Iterator[None]:
    yield from _cold_start_if(request.node.get_closest_marker("cold_start") is not None)


def _cold_start_if(cold: bool) -> Iterator[None]:
    saved = os.environ.pop("TFDIST_TEST_WARM_DIR", None) if cold else None
    try:
        yield
    finally:
        if saved is not None:
            os.environ["TFDIST_TEST_WARM_DIR"] = saved


def pytest_sessionstart(session: pytest.Session) -> None:
    global _started, _load_at_start, _ticks_at_start
    _started, _load_at_start = time.monotonic(), os.getloadavg()
    _ticks_at_start = cpu_ticks()
    if not hasattr(session.config, "workerinput"):  # the controller sees every worker's tests
        _idle.start()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds_by_test[report.nodeid] += report.duration
    _idle.ran(report.nodeid, report.start, report.stop)


def _loads(averages: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.1f}" for x in averages)


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The run's wall time, the machine's cores and load, and its slowest tests."""
    wall = time.monotonic() - _started
    write = terminalreporter.write_line
    terminalreporter.section(f"wall time and the {SLOWEST} slowest tests")
    workers = getattr(config.option, "numprocesses", None) or 1  # pytest-xdist's -n
    write(f"wall time: {wall / 60:.1f} min ({wall:.0f} s) for {len(_seconds_by_test)} tests, "
          f"{workers} pytest worker(s) on {os.cpu_count()} CPU cores; load average (1, 5, 15 "
          f"min) at the start {_loads(_load_at_start)}, at the end {_loads(os.getloadavg())}")
    busy, every = (now - then for now, then in zip(cpu_ticks(), _ticks_at_start, strict=True))
    if every > 0:  # the machine's, this run's and anything else's: how much room -n had
        write(f"the CPU cores were busy {100 * busy / every:.0f}% of that time")
    slowest = sorted(_seconds_by_test.items(), key=lambda item: -item[1])[:SLOWEST]
    for nodeid, seconds in slowest:
        write(f"{seconds:8.1f} s  {nodeid}")
    by_module: defaultdict[str, float] = defaultdict(float)
    for nodeid, seconds in _seconds_by_test.items():
        by_module[nodeid.split("::", 1)[0]] += seconds
    total = sum(by_module.values())
    is_xdist_worker = hasattr(config, "workerinput")  # the controller reads the census
    summary = ("" if is_xdist_worker
               else process_census(os.environ["TFDIST_TEST_PROCESS_LOG"], SLOWEST))
    if summary:
        write(summary)
    write(f"the {SLOWEST_MODULES} slowest modules (their tests' durations added up; all "
          f"modules: {total:.0f} s, {total / max(wall, 1e-9):.2f} x the wall time):")
    for module, seconds in sorted(by_module.items(), key=lambda item: -item[1])[:SLOWEST_MODULES]:
        write(f"{seconds:8.1f} s  {module}")
    if not is_xdist_worker:
        _idle.stop()
        write(f"idle cores: {_idle.total():.0f} core-s in all; the {SLOWEST} tests that ran "
              "while cores sat idle most (each interval's idle shared among the tests in it):")
        for nodeid, seconds in _idle.by_test()[:SLOWEST]:
            write(f"{seconds:8.1f} core-s  {nodeid}")


@pytest.fixture
def cluster_runner(tmp_path: Path) -> Iterator[Callable[..., dict[str, Any]]]:
    """Runs a script once per task of a `ClusterSpec` and returns each task's reported result.

    Every child gets its own TF_CONFIG, the job has a timeout, a failing child is re-raised as
    `TaskFailedError` naming its task, and all children are killed before the fixture returns.

    Example:
        def test_two_workers(cluster_runner):
            spec = tfdist.ClusterSpec.local(workers=2)
            results = cluster_runner(spec, SCRIPTS / "train.py", timeout=90)
            assert results["worker:0"]["weights"] == results["worker:1"]["weights"]
    """
    from tfdist.cluster import release_ports
    from tfdist.testing import run_cluster

    specs = []

    def run(spec: Any, script: str | os.PathLike[str], *args: str, **kwargs: Any) -> dict[str, Any]:
        specs.append(spec)
        kwargs.setdefault("timeout", 120)
        env = {"PYTHONPATH": str(REPO_ROOT), **kwargs.pop("env", {})}
        return run_cluster(spec, script, args, env=env, **kwargs)

    yield run
    for spec in specs:
        release_ports(spec.ports())
