"""Warm starts for the suite's task processes: TensorFlow is imported once, each task is forked.

Every task process a multi-process test starts imports TensorFlow and Keras first: 3.5 CPU-s
each, about 40% of the whole suite's CPU on 2 cores. With ``TFDIST_TEST_WARM_DIR`` set
(``tests/conftest.py`` sets it), a task process that ``tfdist-launch`` (or any test) starts as
``python [-u] script.py ...`` or ``python [-u] -m module ...`` with a ``TF_CONFIG`` becomes a
*shim* at interpreter start (``sitecustomize.py`` calls `shim_or_return`): it hands its command
line, environment, working directory and standard streams to a *warm server* that has already
imported TensorFlow and Keras, which forks a child that becomes the task. The child joins the
shim's network namespace (the job's private network), takes its streams, cwd, environment and
argv, and runs the script as ``__main__`` (``runpy`` for ``-m``); the shim forwards the signals it
gets (SIGTERM, SIGINT, SIGUSR1, ...) to the child and exits with the child's status, by the same
signal if the child died of one. If the shim is SIGKILLed, the server kills the child; if the
server dies, its children die with it (``PR_SET_PDEATHSIG``) and their shims exit with status 1.

What stays real: the task is a process of its own running the real TensorFlow runtime, gRPC
servers and collectives, started by the real launcher, which supervises the shim as it would the
task. What differs, so that tests of exactly that run cold (the ``cold_start`` marker): a
``SIGSTOP`` sent to the launched process stops the shim, not the task; the task's parent is the
warm server, and its ``/proc/PID/cmdline`` is the server's; its peak RSS starts from the server's;
the objects made by the server's imports are never garbage-collected (``gc.freeze``), and at
exit, objects in reference cycles are not collected (Python does not promise to), which saves each
task 1-2 CPU-s.

One server per set of start-up settings (`server_key`: the interpreter, ``PYTHONPATH``, the
``TF_*``/``KERAS_*`` variables read at import, ...); the first shim that needs one starts it and
waits for it (under a lock, so two shims do not start two). A server exits when the process
that set up the directory (``TFDIST_TEST_WARM_OWNER``, the pytest controller) has gone, or after
`IDLE_SECONDS` without a child; ``tests/conftest.py`` also kills every server at the session's
end. Anything unexpected on the shim's side (no server within `START_TIMEOUT`, a refused
connection) makes the process start cold, as without this module.
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import gc
import hashlib
import importlib
import json
import os
import select
import signal
import socket
import sys
import time
from typing import Any, NoReturn

WARM_DIR_ENV = "TFDIST_TEST_WARM_DIR"
PREIMPORT_ENV = "TFDIST_TEST_WARM_PREIMPORT"
"""Modules a server imports besides TensorFlow and Keras, comma-separated (one of its settings):
the examples' tests preload scikit-learn's datasets and metrics, 0.85 CPU-s a task otherwise."""
OWNER_ENV = "TFDIST_TEST_WARM_OWNER"
START_TIMEOUT = 90.0
IDLE_SECONDS = 900.0
"""With 120 s, 54 of a CI run's 55 server starts ended idle, and the two most used sets of
settings were started 13 and 12 times (4 CPU-s each): tests that need the same server are often
minutes apart. An idle server holds ~0.4 GB resident (shared libraries mostly); a run has ~15
sets of settings."""
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                     signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT, signal.SIGTSTP)
_IMPORT_TIME_PREFIXES = ("TF_", "KERAS", "XLA_", "PYTHON", "LD_", "OMP_", "MKL", "CUDA", "HOME",
                         "MALLOC_", "TFDIST_TEST_LEAN", "TFDIST_STARTUP", "TFDIST_KERAS",
                         PREIMPORT_ENV)
"""Variables that may change what importing TensorFlow or Keras does (or, ``MALLOC_``, how
glibc's allocator, set up as a process starts, behaves): they pick the server."""
_PER_TASK = frozenset({"TF_CONFIG", "PYTHONUNBUFFERED"})
_NO_IMPORT_EFFECT = ("TF_CLI_", "TF_VAR_", "TF_PLUGIN_", "PYTHONBREAKPOINT",
                     "PYTHONDONTWRITEBYTECODE")
"""Variables under those prefixes that change nothing a server imports: Terraform's ``TF_*``,
``breakpoint()``'s hook (read when called), ``.pyc`` writing. Some tests pass the environment
whole and others a minimal one: counted, they split one set of settings into several servers
(28 sets became 15 without them, in a CI run's census)."""
_DEFAULTS = {"TF_USE_LEGACY_KERAS": "0"}
"""Values that mean the variable's absence."""
_NOT_WARM = ("PMI_RANK",)
"""Processes of an MPI with a PMI of its own (MPICH's) stay cold: its launcher owns them in
other ways. Open MPI's ranks (``horovodrun --mpi``) and Slurm's tasks (``srun``) run warm, as
Gloo's do: the launcher starts, signals and stops the shim (a SIGKILLed shim's task is killed by
the server), and the task, a child of the server in the shim's network, reads the shim's
environment after the fork (Open MPI's rank calls ``MPI_Init`` then, reaching ``mpirun``'s PMIx
server over its Unix socket). Not in the Slurm step's cgroup: a test of that runs cold. Measured,
load 10-17: the quick benchmark's horovod-mpi allreduce ranks 2.2 CPU-s each warm against 7.5
cold, Slurm's ``slurm_train.py`` tasks 1.3-1.5 against 3.4; every ``--mpi`` and Slurm test passes
warm."""
WARM_MODULES = frozenset({"tfdist.server"})
"""Modules that run warm as tasks; not the launcher's own (``tfdist.launcher.hosts.remote`` watches
its parent, which a forked task does not share)."""
BENCH_WORKERS = ("tfdist.bench.workers.", "tfdist.probe.allreduce_worker")
"""The benchmark's worker modules run warm as tasks, one-process jobs and Horovod ranks too
(the allreduce probe's Gloo ranks: 4 of the quick benchmark's cold starts, 5 CPU-s each)."""
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PR_SET_PDEATHSIG = 1
_CLONE_NEWNET = 0x40000000


# -- the shim ---------------------------------------------------------------------------------


def parse_command(orig_argv: list[str]) -> dict[str, Any] | None:
    """``{"script"| "module": ..., "args": [...], "unbuffered": bool}`` or None (start cold).

    Example:
        >>> parse_command(["python", "-u", "-m", "tfdist.server", "--x"])["module"]
        'tfdist.server'
        >>> parse_command(["python", "-c", "pass"]) is None
        True
    """
    rest = list(orig_argv[1:])
    unbuffered = False
    while rest and rest[0] == "-u":
        unbuffered = True
        rest.pop(0)
    if len(rest) >= 2 and rest[0] == "-m":
        return {"module": rest[1], "args": rest[2:], "unbuffered": unbuffered}
    if rest and not rest[0].startswith("-") and rest[0].endswith(".py"):
        return {"script": rest[0], "args": rest[1:], "unbuffered": unbuffered}
    return None


def server_key(environ: dict[str, str]) -> str:
    """Which warm server can run a process with this environment (same start-up settings)."""
    digest = hashlib.sha256(json.dumps([sys.executable, _settings(environ)]).encode())
    return digest.hexdigest()[:16]


def _settings(environ: dict[str, str]) -> list[tuple[str, str]]:
    """The variables that pick the server, with values that mean their absence left out.

    Example:
        >>> _settings({"TF_CPP_MIN_LOG_LEVEL": "2", "TF_USE_LEGACY_KERAS": "0", "TF_CONFIG": "{}",
        ...            "TF_CLI_CONFIG_FILE": "/root/.terraformrc", "USER": "root",
        ...            "TFDIST_TEST_WARM_PREIMPORT": "sklearn.datasets"})
        [('TFDIST_TEST_WARM_PREIMPORT', 'sklearn.datasets'), ('TF_CPP_MIN_LOG_LEVEL', '2')]
        >>> _settings({"PYTHONPATH": "/s:/r:/r"})  # site.py drops a repeated entry from sys.path
        [('PYTHONPATH', '/s:/r')]
    """
    return sorted((name, _path_once(value) if name == "PYTHONPATH" else value)
                  for name, value in environ.items()
                  if name.startswith(_IMPORT_TIME_PREFIXES) and name not in _PER_TASK
                  and not name.startswith(_NO_IMPORT_EFFECT) and _DEFAULTS.get(name) != value)


def _path_once(value: str) -> str:
    """Each entry of a search path once, first place kept (Slurm's tasks, the job script's
    ``PYTHONPATH`` prepended to the same inherited one, got servers of their own for it)."""
    return os.pathsep.join(dict.fromkeys(value.split(os.pathsep)))


def is_warm_task(command: dict[str, Any] | None, environ: dict[str, str]) -> bool:
    """Whether a process runs warm: a task (``TF_CONFIG``) running a script or `WARM_MODULES`,
    any script of this checkout's tests and examples (their one-process reference runs), or a
    benchmark worker (`BENCH_WORKERS`).

    Example:
        >>> is_warm_task(parse_command(["py", "-m", "tfdist.server"]), {"TF_CONFIG": "{}"})
        True
        >>> remote = ["py", "-m", "tfdist.launcher.hosts.remote"]
        >>> is_warm_task(parse_command(remote), {"TF_CONFIG": "{}"})
        False
        >>> is_warm_task(parse_command(["py", "-m", "tfdist.bench.workers.train_worker"]), {})
        True
    """
    if command is None or any(name in environ for name in _NOT_WARM):
        return False
    if "module" in command:
        if command["module"].startswith(BENCH_WORKERS):
            return True
        return command["module"] in WARM_MODULES and "TF_CONFIG" in environ
    if "TF_CONFIG" in environ:
        return True
    script = os.path.realpath(command["script"])
    return any(script.startswith(os.path.join(_CHECKOUT, folder) + os.sep)
               for folder in ("tests", "keras_examples"))


def shim_or_return() -> None:
    """Becomes the shim of a warm-started task and never returns, or returns (start cold)."""
    warm_dir = os.environ.get(WARM_DIR_ENV)
    command = parse_command(list(getattr(sys, "orig_argv", [])))
    if not warm_dir or not is_warm_task(command, dict(os.environ)):
        return
    assert command is not None
    environ = dict(os.environ)
    conn = _connect(warm_dir, server_key(environ), environ)
    if conn is None:
        return
    request = {**command, "env": environ, "cwd": os.getcwd(), "umask": _umask(),
               "orig_argv": list(sys.orig_argv)}
    try:
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
        child = _read_message(conn)
    except OSError:
        child = None
    if not child or "pid" not in child:
        conn.close()
        return
    _relay(conn)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _connect(warm_dir: str, key: str, environ: dict[str, str]) -> socket.socket | None:
    path = os.path.join(warm_dir, f"{key}.sock")
    conn = _try_connect(path)
    if conn is not None:
        return conn
    deadline = time.monotonic() + START_TIMEOUT
    with open(os.path.join(warm_dir, f"{key}.lock"), "w") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.05)
        conn = _try_connect(path)
        if conn is None:
            conn = _start_server(warm_dir, key, path, environ, deadline)
    return conn


def _try_connect(path: str) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        return None
    return conn


def _start_server(warm_dir: str, key: str, path: str, environ: dict[str, str],
                  deadline: float) -> socket.socket | None:
    env = {name: value for name, value in environ.items()  # the server itself starts cold
           if name not in _PER_TASK and name != WARM_DIR_ENV}
    owner = int(environ.get(OWNER_ENV, "0"))
    if owner <= 0:
        return None
    _census({"kind": "server_settings", "key": key, "settings": _settings(environ),
             "time": round(time.time(), 1)})
    server = _spawn_detached(
        [sys.executable, "-u", os.path.abspath(__file__), "serve", path], env, warm_dir,
        os.path.join(warm_dir, f"{key}.log"), owner)
    if server is None:
        return None
    while time.monotonic() < deadline:
        conn = _try_connect(path)
        if conn is not None:
            return conn
        if not _alive(server):
            return None
        time.sleep(0.1)
    _kill(server, signal.SIGKILL)
    return None


def _spawn_detached(argv: list[str], env: dict[str, str], cwd: str, log: str,
                    owner: int) -> int | None:
    """Starts ``argv`` as nobody's descendant, in ``owner``'s network namespace; its pid.

    Not a child of this task (a test that lists the job's process tree would find the server
    left behind), and not in this job's network (a private one, a fake host's: the server
    would keep it, and be counted in it, after the job). A double fork; the middle process
    reports the server's pid through a pipe.
    """
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:  # pragma: no cover - the middle process: setsid, setns, fork, report, exit
        try:
            os.close(read_end)
            os.setsid()
            _join_network_of(owner, ctypes.CDLL("libc.so.6", use_errno=True))
            _join_cgroup_of(owner)
            server = os.fork()
            if server == 0:
                os.close(write_end)
                os.chdir(cwd)
                out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                os.dup2(out, 1)
                os.dup2(out, 2)
                os.execve(argv[0], argv, env)
            os.write(write_end, str(server).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(middle, 0)
    with os.fdopen(read_end, "rb") as reported:
        pid = reported.read().decode()
    return int(pid) if pid.isdigit() else None


def _relay(conn: socket.socket) -> NoReturn:
    """Forwards signals to the task until it exits, then exits as it did."""

    def forward(signum: int, _frame: object) -> None:
        try:
            conn.sendall(json.dumps({"signal": signum}).encode() + b"\n")
        except OSError:
            pass

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)
    try:
        message = _read_message(conn)
    except OSError:
        message = None
    if not message or "status" not in message:
        os.write(2, b"[warm start] the warm-start server went away; the task is lost\n")
        os._exit(1)
    status = message["status"]
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


def _read_message(conn: socket.socket) -> dict[str, Any] | None:
    """One JSON line from ``conn`` (None at end of stream)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(1)
        if not chunk:
            return None
        data += chunk
    return json.loads(data)


# -- the server -------------------------------------------------------------------------------


class _Child:
    def __init__(self, pid: int, conn: socket.socket) -> None:
        self.pid, self.conn, self.pending = pid, conn, b""


def serve(path: str) -> dict[str, Any]:
    """Imports TensorFlow, then forks a task per connection; returns only in a forked child."""
    started, key = time.monotonic(), os.path.basename(path)[:-len(".sock")]

    def end(why: str) -> None:
        _census({"kind": "server_end", "pid": os.getpid(), "why": why, "key": key,
                 "age_s": round(time.monotonic() - started, 1), "time": round(time.time(), 1)})

    def terminated(*_: object) -> NoReturn:  # tests/conftest.py ends the session
        end("SIGTERM")
        sys.exit(0)

    signal.signal(signal.SIGTERM, terminated)
    _preimport()
    # The garbage collector's full passes, and the interpreter's exit, walk every object the
    # imports made (millions): ~1 CPU-s at each task's exit. Frozen, the children skip them.
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = f"{path}.{os.getpid()}"
    listener.bind(staging)
    listener.listen(64)
    os.rename(staging, path)  # shims connect only once the server is ready
    with open(path[:-len(".sock")] + ".pid", "w") as pidfile:
        pidfile.write(str(os.getpid()))
    owner = int(os.environ.get(OWNER_ENV, "0"))
    children: dict[int, _Child] = {}
    idle_since = time.monotonic()
    while True:
        readable, _, _ = select.select([listener, *(c.conn for c in children.values())], [], [],
                                       0.1)
        if listener in readable:
            job = _accept(listener, children)
            if job is not None:
                return job
        for child in list(children.values()):
            if child.conn in readable:
                _handle(child)
        _reap(children)
        if children:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > IDLE_SECONDS or not _alive(owner):
            os.unlink(path)
            end("idle" if _alive(owner) else "owner gone")
            return {}


def _preimport() -> None:
    import numpy  # noqa: F401
    import tensorflow  # noqa: F401

    if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
        import tf_keras  # noqa: F401
    else:
        import keras  # noqa: F401
    for name in filter(None, os.environ.get(PREIMPORT_ENV, "").split(",")):
        importlib.import_module(name)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _accept(listener: socket.socket, children: dict[int, _Child]) -> dict[str, Any] | None:
    conn, _ = listener.accept()
    conn.settimeout(10)
    try:
        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        while not data.endswith(b"\n"):
            more = conn.recv(1 << 20)
            if not more:
                raise OSError("the shim closed the connection")
            data += more
        request = json.loads(data)
        peer = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        request["peer_pid"] = int.from_bytes(peer[:4], sys.byteorder)
    except (OSError, ValueError):
        conn.close()
        return None
    conn.settimeout(None)
    pid = os.fork()
    if pid == 0:
        listener.close()
        for child in children.values():
            child.conn.close()
        conn.close()
        request["fds"] = fds
        return request
    for fd in fds:
        os.close(fd)
    children[pid] = _Child(pid, conn)
    try:
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    except OSError:
        os.kill(pid, signal.SIGKILL)
    return None


def _handle(child: _Child) -> None:
    try:
        data = child.conn.recv(4096)
    except OSError:
        data = b""
    if not data:  # the shim is gone (SIGKILLed, say): so goes its task
        _kill(child.pid, signal.SIGKILL)
        return
    child.pending += data
    *lines, child.pending = child.pending.split(b"\n")
    for line in lines:
        _kill(child.pid, json.loads(line)["signal"])


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(children: dict[int, _Child]) -> None:
    while children:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        child = children.pop(pid, None)
        if child is None:
            continue
        _census({"kind": "reaped", "pid": pid, "cpu": round(usage.ru_utime + usage.ru_stime, 2)})
        try:
            child.conn.sendall(json.dumps({"status": status}).encode() + b"\n")
        except OSError:
            pass
        child.conn.close()


def _census(record: dict[str, Any]) -> None:
    """A line of the census (``sitecustomize.py``) from the server: a task it reaped, however
    it ended (one killed with its job or ended by ``os._exit`` writes no exit line of its own),
    or its own end and why (a server that logs none was killed)."""
    path = os.environ.get("TFDIST_TEST_PROCESS_LOG")
    if path:
        try:
            with open(path, "a") as log:
                log.write(json.dumps(record) + "\n")
        except OSError:
            pass


# -- the forked child -------------------------------------------------------------------------


def become(request: dict[str, Any]) -> None:
    """Turns this forked child into the task ``request`` describes, then runs it."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    os.setsid()
    # At exit (after the script's own exit handlers), freeze what the task made: the
    # interpreter's final collections then skip it (1-2 CPU-s after a small fit). Module
    # teardown still runs; cycles left at exit are not collected.
    atexit.register(gc.freeze)
    _join_network_of(request["peer_pid"], libc)
    for target, fd in enumerate(request["fds"]):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.orig_argv = request["orig_argv"]
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # as a fresh process would: not the server's stream
    _log_census_start()
    if "module" in request:
        import runpy

        sys.argv = [request["module"], *request["args"]]
        sys.path[0] = os.getcwd()
        runpy._run_module_as_main(request["module"], alter_argv=True)  # what `python -m` runs
        return
    _run_script(request["script"], request["args"])


def _join_network_of(pid: int, libc: ctypes.CDLL) -> None:
    theirs, ours = f"/proc/{pid}/ns/net", "/proc/self/ns/net"
    if os.stat(theirs).st_ino == os.stat(ours).st_ino:
        return
    fd = os.open(theirs, os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns into the shim's network namespace failed")
    finally:
        os.close(fd)


def _join_cgroup_of(pid: int) -> None:
    """Moves this process into ``pid``'s cgroup v2, where there is one: not the cgroup of the
    task that started the server (the launcher kills a task's cgroup when it ends or restarts
    alone, `tfdist.launcher.containment`: the server and every warm task of the suite with it)."""
    try:
        own = next((line[3:] for line in open(f"/proc/{pid}/cgroup").read().splitlines()
                    if line.startswith("0::")), None)
        mounts = open("/proc/self/mountinfo").read().splitlines()
    except OSError:
        return
    mount = next((fields[4] for fields in map(str.split, mounts)
                  if "-" in fields and fields[fields.index("-") + 1] == "cgroup2"), None)
    if own is None or mount is None:
        return
    try:
        with open(os.path.join(mount, own.lstrip("/"), "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))
    except OSError:
        pass  # not root, or a cgroup that takes no processes: the server stays where it is


def _log_census_start() -> None:
    census = sys.modules.get("sitecustomize")
    start = getattr(census, "census_start", None)
    if start is None:
        start = getattr(sys.modules.get("tfdist_chained_sitecustomize"), "census_start", None)
    if start is not None:
        start(warm=True)


def _run_script(script: str, args: list[str]) -> None:
    import types

    path = os.path.abspath(script)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(path)
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    with open(path, "rb") as source:
        code = compile(source.read(), path, "exec")
    exec(code, main.__dict__)


if __name__ == "__main__":
    if sys.argv[1:2] != ["serve"]:
        sys.exit("usage: python warm_start.py serve SOCKET_PATH")
    job = serve(sys.argv[2])
    if not job:
        sys.exit(0)
    become(job)
