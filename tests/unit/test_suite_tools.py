"""The suite's own measuring tools (tests/idle_cores.py, tests/census.py) do what they say."""

from __future__ import annotations

import doctest

import census
import idle_cores


def test_idle_cores_examples_run():
    assert doctest.testmod(idle_cores).failed == 0


def test_idle_time_goes_to_the_tests_that_ran_in_it():
    idle = idle_cores.IdleCores(cores=2)
    idle.samples = [(0.0, 0, 0), (1.0, 100, 100), (2.0, 100, 200)]  # busy, then all idle
    idle.ran("busy", 0.0, 1.0)
    idle.ran("waiting", 1.0, 2.0)
    assert idle.total() == 2.0
    assert idle.by_test() == [("waiting", 2.0)]


def test_the_census_counts_warm_servers_and_how_they_ended():
    def server(sock):
        return {"kind": "start", "argv": ["python", "-u", "warm_start.py", "serve", sock]}

    records = [server("/w/a.sock"), server("/w/b.sock"), server("/w/a.sock"),
               {"kind": "server_end", "why": "idle"}, {"kind": "start", "argv": ["python"]}]
    assert census.warm_servers(records) == (
        "warm servers: 3 started for 2 sets of settings; ended: killed or still running 2, "
        "idle 1")
    assert census.warm_servers(records[-1:]) == ""


def test_horovod_checks_examples_run():
    import horovod_checks

    assert doctest.testmod(horovod_checks).failed == 0


def test_a_horovod_check_runs_once_per_session_and_its_answer_is_shared(tmp_path):
    # Two processes of one session (two wrappers of one file): the second does not run it.
    import horovod_checks

    runs = []

    def check(ext, fn, desc, verbose):
        runs.append((ext, desc))
        if ext != "tensorflow":
            return None  # Horovod's answer for an extension it did not build
        return {"built with Gloo": True, "built with MPI": False}[desc]

    path = str(tmp_path / horovod_checks.CACHE_FILE)
    first, second = (horovod_checks.recorded(check, path) for _ in range(2))
    assert first("tensorflow", None, "built with Gloo", False) is True
    assert second("tensorflow", None, "built with Gloo", False) is True
    assert second("tensorflow", None, "built with MPI", False) is False
    assert second("torch", None, "built with Gloo", False) is None  # not built: asked, kept
    assert first("torch", None, "built with Gloo", False) is None
    assert runs == [("tensorflow", "built with Gloo"), ("tensorflow", "built with MPI"),
                    ("torch", "built with Gloo")]
