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
