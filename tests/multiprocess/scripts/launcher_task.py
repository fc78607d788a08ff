"""A task for launcher tests (no TensorFlow): behaves as LAUNCHER_TEST_MODE says.

Modes: ``ok`` (print the task and exit 0), ``fail_worker1`` (worker:1 exits 3, the rest sleep),
``sleep`` (everyone sleeps), ``fail_once`` (the first attempt of worker:1 fails once worker:0 has
started, later ones pass; attempts are counted in the MARKER_DIR directory), ``fail_evaluator`` (the
evaluator exits 4 at once, the others finish 1 s after it started: at least 5 of the
launcher's polls, so the failure is seen while they run), ``save_on_sigterm`` (everyone sleeps; on
SIGTERM a task prints tfdist's preemption line and exits 75, as a training task that saved would),
``worker1_ignores_sigterm`` (as ``save_on_sigterm``, but worker:1 ignores SIGTERM),
``finish_on_sigterm`` (on SIGTERM a task finishes its work and exits 0).
"""

import json
import os
import signal
import sys
import time

from markers import wait_for_marker

from tfdist.resilience.preemption import PREEMPTED_EXIT_STATUS, marker_line

tf_config = json.loads(os.environ.get("TF_CONFIG", '{"task": {"type": "chief", "index": 0}}'))
task = f"{tf_config['task']['type']}:{tf_config['task']['index']}"
mode = os.environ.get("LAUNCHER_TEST_MODE", "ok")
marker_dir = os.environ.get("MARKER_DIR", "")
if marker_dir:
    with open(os.path.join(marker_dir, f"{task}.pid.{os.getpid()}"), "w"):
        pass
print(f"task {task} mode {mode} pid {os.getpid()}", flush=True)

if mode == "fail_worker1" and task == "worker:1":
    time.sleep(1)
    print("worker 1 gives up", flush=True)
    sys.exit(3)
if mode == "fail_once" and task == "worker:1":
    attempts = len([f for f in os.listdir(marker_dir) if f.startswith("worker:1.pid.")])
    if attempts == 1:
        wait_for_marker(marker_dir, "worker:0.pid.")  # the test counts its starts
        sys.exit(5)
if mode == "fail_evaluator":
    if task == "evaluator:0":
        print("evaluator gives up", flush=True)
        sys.exit(4)
    wait_for_marker(marker_dir, "evaluator:0.pid.")
    time.sleep(1)
    print(f"{task} trained", flush=True)
if mode in ("save_on_sigterm", "worker1_ignores_sigterm", "finish_on_sigterm"):
    def save_and_exit(signum, frame):
        if mode == "finish_on_sigterm":
            sys.exit(0)
        print(marker_line(f"step 7 in /ckpt/{task}"), flush=True)
        sys.exit(PREEMPTED_EXIT_STATUS)

    ignore = mode == "worker1_ignores_sigterm" and task == "worker:1"
    signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore else save_and_exit)
    print(f"{task} ready", flush=True)
if mode in ("fail_worker1", "sleep", "save_on_sigterm", "worker1_ignores_sigterm",
            "finish_on_sigterm"):
    time.sleep(300)
