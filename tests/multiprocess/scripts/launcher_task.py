"""A task for launcher tests (no TensorFlow): behaves as LAUNCHER_TEST_MODE says.

Modes: ``ok`` (print the task and exit 0), ``fail_worker1`` (worker:1 exits 3, the rest sleep),
``sleep`` (everyone sleeps), ``fail_once`` (the first attempt of worker:1 fails, later ones pass;
attempts are counted in the MARKER_DIR directory), ``fail_evaluator`` (the evaluator exits 4 at
once, the others finish after 2 s).
"""

import json
import os
import sys
import time

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
        sys.exit(5)
if mode == "fail_evaluator":
    if task == "evaluator:0":
        print("evaluator gives up", flush=True)
        sys.exit(4)
    time.sleep(2)
    print(f"{task} trained", flush=True)
if mode in ("fail_worker1", "sleep"):
    time.sleep(300)
