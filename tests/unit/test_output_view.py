"""The launcher's default view of task output (`tfdist.launcher.output`), line by line.

The noise lines are verbatim from a 2-worker ``make main`` run (TF 2.21, no GPU).
"""

from __future__ import annotations

import pytest

from tfdist.launcher.output import LineView, shown_tasks, task_filters

pytestmark = pytest.mark.unit

STARTUP_CHATTER = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795429598.158299   18999 port.cc:153] oneDNN custom operations are on. You may "
    "see slightly different numerical results due to floating-point round-off errors from "
    "different computation orders. To turn them off, set the environment variable "
    "`TF_ENABLE_ONEDNN_OPTS=0`.",
    "I0000 00:00:1795429598.158830   18999 cudart_stub.cc:31] Could not find cuda drivers on "
    "your machine, GPU will not be used.",
    "E0000 00:00:1795429602.204469   18999 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
    "CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
]
CUINIT_FAILED = STARTUP_CHATTER[3]


def test_startup_chatter_is_dropped_and_the_rest_kept():
    view = LineView(min_level=2)
    assert [view(line) for line in STARTUP_CHATTER] == [False] * 4
    for line in ["Epoch 1/8", "Traceback (most recent call last):",
                 "E0000 00:00:1795429602.2 18999 collective_ops.cc:9] Collective failed",
                 "F0000 00:00:1795429602.2 18999 check.cc:1] Check failed: x"]:
        assert view(line), line


def test_a_cuinit_error_without_the_no_driver_line_is_shown():
    # On a machine with a GPU driver, a failed cuInit is a real problem.
    assert LineView(min_level=2)(CUINIT_FAILED)


def test_the_tasks_log_level_decides_which_absl_lines_are_shown():
    warning = "W0000 00:00:1795429602.2 18999 local_rendezvous.cc:405] Local rendezvous aborting"
    assert not LineView(min_level=2)(warning)
    assert LineView(min_level=1)(warning)
    assert LineView(min_level=0)(STARTUP_CHATTER[1])


def test_horovod_ranks_other_than_0_are_hidden():
    view = LineView(first_rank_only=True)
    assert view("[0]<stdout>:Epoch 1/2")
    assert not view("[1]<stdout>:Epoch 1/2")
    assert not view("[0]<stderr>:" + STARTUP_CHATTER[0])


def test_shown_tasks_are_the_chief_and_the_sidecars():
    assert shown_tasks(["worker:0", "worker:1"], {}) == {"worker:0"}
    assert shown_tasks(["chief:0", "worker:0", "ps:0"], {}) == {"chief:0"}
    assert shown_tasks(["horovodrun"], {}) == {"horovodrun"}
    assert shown_tasks(["chief:0", "worker:0", "evaluator:0"],
                       {"evaluator:0": "sidecar"}) == {"chief:0", "evaluator:0"}


def test_verbose_shows_every_line_of_every_task():
    tasks = [("worker:0", "main", {}), ("worker:1", "main", {})]
    assert task_filters(tasks, verbose=True) == {"worker:0": None, "worker:1": None}
    quiet = task_filters(tasks, verbose=False)
    assert quiet["worker:0"]("Epoch 1/2") and not quiet["worker:1"]("Epoch 1/2")
    assert not quiet["worker:0"](STARTUP_CHATTER[0])


def test_the_log_level_comes_from_the_tasks_environment():
    tasks = [("chief:0", "main", {"TF_CPP_MIN_LOG_LEVEL": "0"})]
    assert task_filters(tasks, verbose=False)["chief:0"](STARTUP_CHATTER[1])
