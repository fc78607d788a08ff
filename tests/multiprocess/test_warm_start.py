"""The suite's warm starts (tests/warm_start.py) keep a task's process semantics: the forked task
gets the shim's argv, environment, cwd and streams, TensorFlow already imported; the shim exits
with the task's status or signal, forwards SIGTERM, and takes its task with it when SIGKILLed."""

from __future__ import annotations

import doctest
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
import warm_start  # noqa: E402

TASK = """
import json, os, sys, time
warm = "tensorflow" in sys.modules  # imported before this line only in a warm start
print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv, "warm": warm,
                  "cwd": os.getcwd(), "x": os.environ.get("X"), "line": sys.stdin.readline()}),
      flush=True)
mode = sys.argv[1]
if mode == "exit":
    sys.exit(3)
time.sleep(60)
"""


@pytest.fixture(scope="module")
def warm_env(tmp_path_factory):
    """An environment whose task processes start warm, on a server of this module's own."""
    warm_dir = tmp_path_factory.mktemp("warm")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CONFIG": "{}", "X": "from the shim",
           warm_start.WARM_DIR_ENV: str(warm_dir), warm_start.OWNER_ENV: str(os.getpid())}
    yield env
    for pidfile in warm_dir.glob("*.pid"):
        os.kill(int(pidfile.read_text()), signal.SIGKILL)


def start(env, tmp_path, mode):
    script = tmp_path / "task.py"
    script.write_text(TASK)
    shim = subprocess.Popen([sys.executable, "-u", str(script), mode], env=env, cwd=tmp_path,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    shim.stdin.write("a line\n")
    shim.stdin.flush()
    return shim, json.loads(shim.stdout.readline())


def gone(pid, within=10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_the_task_runs_forked_with_the_shims_command_and_exits_with_its_status(warm_env,
                                                                                tmp_path):
    shim, seen = start(warm_env, tmp_path, "exit")
    assert shim.wait(timeout=120) == 3
    assert seen["warm"] and seen["pid"] != shim.pid and seen["ppid"] != shim.pid
    assert seen["argv"] == [str(tmp_path / "task.py"), "exit"]
    assert (seen["cwd"], seen["x"], seen["line"]) == (str(tmp_path), "from the shim", "a line\n")


def test_sigterm_reaches_the_task_and_the_shim_dies_of_it(warm_env, tmp_path):
    shim, seen = start(warm_env, tmp_path, "sleep")
    shim.send_signal(signal.SIGTERM)
    assert shim.wait(timeout=30) == -signal.SIGTERM
    assert gone(seen["pid"])


def test_a_sigkilled_shim_takes_its_task_with_it(warm_env, tmp_path):
    shim, seen = start(warm_env, tmp_path, "sleep")
    shim.kill()
    assert shim.wait(timeout=30) == -signal.SIGKILL
    assert gone(seen["pid"])


def test_a_task_killed_by_a_signal_is_reported_by_that_signal(warm_env, tmp_path):
    shim, seen = start(warm_env, tmp_path, "sleep")
    os.kill(seen["pid"], signal.SIGKILL)
    assert shim.wait(timeout=30) == -signal.SIGKILL


@pytest.mark.unit
def test_which_processes_start_warm():
    task = {"TF_CONFIG": "{}"}
    assert warm_start.is_warm_task(warm_start.parse_command(["py", "-u", "t.py", "a"]), task)
    assert warm_start.is_warm_task(warm_start.parse_command(["py", "-m", "tfdist.server"]), task)
    assert not warm_start.is_warm_task(
        warm_start.parse_command(["py", "-m", "tfdist.launcher.hosts.remote"]), task)
    assert not warm_start.is_warm_task(warm_start.parse_command(["py", "/elsewhere/t.py"]), {})
    assert warm_start.is_warm_task(
        warm_start.parse_command(["py", str(REPO / "keras_examples" / "deep_mlp.py")]), {})
    for launched in ({"OMPI_COMM_WORLD_RANK": "0"}, {"SLURM_JOB_ID": "7"}):  # Open MPI, srun
        assert warm_start.is_warm_task(warm_start.parse_command(["py", "t.py"]),
                                       {**task, **launched})
    assert not warm_start.is_warm_task(warm_start.parse_command(["py", "t.py"]),
                                       {**task, "PMI_RANK": "0"})
    assert warm_start.parse_command(["py", "-X", "importtime", "t.py"]) is None
    keras3, legacy = {"PYTHONPATH": "/x"}, {"PYTHONPATH": "/x", "TF_USE_LEGACY_KERAS": "1"}
    assert warm_start.server_key(keras3) != warm_start.server_key(legacy)
    assert warm_start.server_key(keras3) == warm_start.server_key({**keras3, **task, "Y": "1"})
    same = {**keras3, "TF_USE_LEGACY_KERAS": "0", "TF_CLI_CONFIG_FILE": "/r/.terraformrc",
            "PYTHONDONTWRITEBYTECODE": "1"}  # what a test's whole environment adds
    assert warm_start.server_key(keras3) == warm_start.server_key(same)
    assert warm_start.server_key(keras3) != warm_start.server_key({**keras3, "HOME": "/h"})
    assert warm_start.server_key(keras3) == warm_start.server_key({"PYTHONPATH": "/x:/x"})
    assert doctest.testmod(warm_start).failed == 0
