"""A task for the supervision scenarios (no TensorFlow): ``supervision_task.py MODE MARKER_DIR``.

It names itself from TF_CONFIG, records each start as ``MARKER_DIR/<task>.start.<pid>``, and:

* ``fail_worker1``: worker:1, once every task of TF_CONFIG has started, prints "worker 1 gives
  up" and exits 3; the rest sleep.
* ``fail_evaluator``: the evaluator exits 4 at once; the others exit 0 1 s after it started
  (the launcher, polling every 0.2 s at most, finds it failed while they run).
* ``restart_worker1``: worker:1's first run exits 9, its later runs serve (sleep); the chief
  exits 0 once worker:1 has started twice (the launcher announced the restart before it started
  the new run); the other servers sleep.
* ``kill_ps``: ps:0 exits 9 once every task of TF_CONFIG has started; the rest sleep.
* ``fail_once``: worker:1's first run exits 5 once worker:0 has started (whose first run is
  still in its 1 s then); every later run of every task exits 0 at once.
* ``sleep``: every task sleeps.
* ``save_on_sigterm``, ``worker1_ignores_sigterm``: every task writes ``<task>.ready`` and sleeps;
  on SIGTERM it prints tfdist's preemption line and exits 75 (worker:1 of the second mode
  ignores SIGTERM).
"""

import json
import os
import signal
import sys
import time

from markers import wait_for_marker

from tfdist.resilience.preemption import PREEMPTED_EXIT_STATUS, marker_line

mode, marker_dir = sys.argv[1], sys.argv[2]
tf_config = json.loads(os.environ["TF_CONFIG"])
spec = tf_config["task"]
task = f"{spec['type']}:{spec['index']}"
runs = len([f for f in os.listdir(marker_dir) if f.startswith(f"{task}.start.")])
open(os.path.join(marker_dir, f"{task}.start.{os.getpid()}"), "w").close()
print(f"{task} started ({mode})", flush=True)


def wait_for_every_task():
    """Until every task of TF_CONFIG's cluster has left its start marker (at most 30 s in all):
    the failure then finds the whole job running (a fixed 1 s sleep before)."""
    deadline = time.monotonic() + 30
    for kind, addresses in tf_config["cluster"].items():
        for index in range(len(addresses)):
            wait_for_marker(marker_dir, f"{kind}:{index}.start.", deadline - time.monotonic())


def save_and_exit(signum, frame):
    print(marker_line(f"step 7 in /ckpt/{task}"), flush=True)
    sys.exit(PREEMPTED_EXIT_STATUS)


if mode == "fail_worker1" and task == "worker:1":
    wait_for_every_task()
    print("worker 1 gives up", flush=True)
    sys.exit(3)
if mode == "fail_evaluator":
    if task == "evaluator:0":
        print("evaluator gives up", flush=True)
        sys.exit(4)
    wait_for_marker(marker_dir, "evaluator:0.start.")
    time.sleep(1)
    sys.exit(0)
if mode == "restart_worker1":
    if task == "worker:1" and runs == 0:
        print("worker 1 dies", flush=True)
        sys.exit(9)
    if task == "chief:0":
        wait_for_marker(marker_dir, "worker:1.start.", count=2)
        sys.exit(0)
if mode == "kill_ps" and task == "ps:0":
    wait_for_every_task()
    print("ps 0 dies", flush=True)
    sys.exit(9)
if mode == "fail_once":
    if task == "worker:1" and runs == 0:
        wait_for_marker(marker_dir, "worker:0.start.")  # the test counts its starts
        sys.exit(5)
    if runs == 0:
        time.sleep(1)
    sys.exit(0)
if mode in ("save_on_sigterm", "worker1_ignores_sigterm"):
    ignore = mode == "worker1_ignores_sigterm" and task == "worker:1"
    signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore else save_and_exit)
    open(os.path.join(marker_dir, f"{task}.ready"), "w").close()
time.sleep(300)
