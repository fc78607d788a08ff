"""Counts of tasks, slots and nodes: one check, one wording, bounded by MAX_TASKS."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tfdist.cluster import (
    MAX_TASKS,
    ClusterSpec,
    expand_nodelist,
    held_ports,
    parse_tasks_per_node,
    read_pai_table,
    reserve_ports,
)
from tfdist.cluster.counts import check_count, parse_count
from tfdist.errors import ClusterConfigError

pytestmark = pytest.mark.unit


def parts(*fragments: str) -> str:
    """A regex matching the fragments, in order, anywhere in the message."""
    return ".*".join(re.escape(fragment) for fragment in fragments)


def pai(*rows: list[str]) -> list[list[str]]:
    """5-column PAI rows of job 'j' from (task_name, inst_num) pairs."""
    return [["j", name, inst_num, "600", "50"] for name, inst_num in rows]


LIMIT = f"is larger than {MAX_TASKS} (tfdist.cluster.MAX_TASKS)"

HUGE_COUNTS = [
    pytest.param(
        lambda: read_pai_table(pai(["worker", "1000000000"])),
        parts("the inst_num of row 1", LIMIT, "Received: '1000000000'", "Fix: "),
        id="pai-inst-num",
    ),
    pytest.param(
        lambda: read_pai_table(pai(["worker", "1e9"])),
        parts("the inst_num of row 1", LIMIT, "Received: '1e9'"),
        id="pai-inst-num-exponent",
    ),
    pytest.param(
        lambda: read_pai_table(pai(["worker", "6000"], ["tensorflow", "6000"])),
        parts("row 2 brings the worker tasks to 12000, more than 10000", "Fix: Check the inst_num"),
        id="pai-role-total",
    ),
    pytest.param(
        lambda: expand_nodelist("node[1-100000000]"),
        parts("the number of nodes in the node list", LIMIT, "Received: 'node[1-100000000]'"),
        id="slurm-node-range",
    ),
    pytest.param(
        lambda: expand_nodelist("rack[1-1000]-n[1-1000]"),
        parts("the number of nodes in the node list", LIMIT),
        id="slurm-node-groups-multiply",
    ),
    pytest.param(
        lambda: expand_nodelist(",".join(["n[1-9999]"] * 1000)),
        parts("the number of nodes in the node list", LIMIT),
        id="slurm-many-items",
    ),
    pytest.param(
        lambda: expand_nodelist("n[1-" + "9" * 5000 + "]"),
        parts("the node list has an invalid range"),
        id="slurm-range-of-5000-digits",
    ),
    pytest.param(
        lambda: parse_tasks_per_node("2(x100000000)", 1),
        parts("the repeat count in SLURM_TASKS_PER_NODE", LIMIT, "Received: '2(x100000000)'"),
        id="slurm-tasks-repeat",
    ),
    pytest.param(
        lambda: parse_tasks_per_node("1(x9000),1(x9000)", 18000),
        parts("the number of nodes in SLURM_TASKS_PER_NODE", LIMIT),
        id="slurm-tasks-repeat-total",
    ),
    pytest.param(
        lambda: parse_tasks_per_node("100000000", 1),
        parts("the tasks per node in SLURM_TASKS_PER_NODE", LIMIT),
        id="slurm-tasks-per-node",
    ),
    pytest.param(
        lambda: ClusterSpec.from_slurm(
            {"SLURM_JOB_NODELIST": "n1", "SLURM_NTASKS_PER_NODE": "100000000"}
        ),
        parts("SLURM_NTASKS_PER_NODE", LIMIT, "Received: '100000000'"),
        id="slurm-ntasks-per-node",
    ),
    pytest.param(
        lambda: ClusterSpec.local(workers=10**9),
        parts("workers", LIMIT, "Received: workers=1000000000"),
        id="local-workers",
    ),
    pytest.param(
        lambda: ClusterSpec.from_hosts("a:100000000"),
        parts("the slot count of entry 'a:100000000'", LIMIT, "Received: 'a:100000000'"),
        id="host-slots",
    ),
    pytest.param(
        lambda: ClusterSpec.from_hosts("a:10000,b:10000"),
        parts("workers=None makes every slot left a worker: 20000, more than 10000",
              "Fix: Pass workers="),
        id="all-slots-as-workers",
    ),
]


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("make", "match"), HUGE_COUNTS)
def test_huge_counts_are_refused_at_once(make: Callable[[], object], match: str) -> None:
    before = held_ports()
    with pytest.raises(ClusterConfigError, match=match):
        make()
    assert held_ports() == before


def test_counts_up_to_the_limit_are_accepted() -> None:
    assert read_pai_table(pai(["worker", str(MAX_TASKS)])).instances == {"worker": MAX_TASKS}
    assert len(expand_nodelist(f"n[1-{MAX_TASKS}]")) == MAX_TASKS
    assert parse_tasks_per_node(f"1(x{MAX_TASKS})", MAX_TASKS) == [1] * MAX_TASKS
    spec = ClusterSpec.from_hosts(f"a:{MAX_TASKS}", base_port=20000)
    assert len(spec.worker) == MAX_TASKS and spec.worker[-1] == f"a:{20000 + MAX_TASKS - 1}"


# ---------------------------------------------------------------------------------------- ports


def test_a_huge_slot_count_never_gives_a_negative_port_range() -> None:
    with pytest.raises(ClusterConfigError) as info:
        ClusterSpec.from_hosts("a:99999")
    message = str(info.value)
    assert "..-" not in message
    assert re.search(parts("the slot count of entry 'a:99999'", LIMIT, "Received: 'a:99999'",
                           "Expected: an integer in 1..10000"), message)


def test_base_port_plus_slots_past_65535_names_both() -> None:
    match = parts(
        "base_port 60000 with 10000 slots on host 'a' needs ports up to 69999, past 65535",
        "Received: base_port=60000, a:10000",
        "Expected: base_port + slots - 1 <= 65535, so base_port <= 55536 for 10000 slots",
        "Fix: Use a lower base_port (e.g. 2222), or give 'a' fewer slots",
    )
    with pytest.raises(ClusterConfigError, match=match):
        ClusterSpec.from_hosts("b:1,a:10000", base_port=60000)
    assert ClusterSpec.from_hosts("a:2", base_port=65534).worker == ("a:65534", "a:65535")


@pytest.mark.parametrize("base_port", [0, 65536, True, "2222", None])
def test_base_port_that_is_not_a_port_is_refused(base_port: object) -> None:
    with pytest.raises(ClusterConfigError, match=parts(
        "base_port is not a port number", "Expected: an integer in 1..65535",
        "Fix: Use base_port=2222",
    )):
        ClusterSpec.from_hosts("a:2", base_port=base_port)  # type: ignore[arg-type]


# ------------------------------------------------------------------- one check, one wording


def _hostfile(tmp_path: Path, text: str) -> Callable[[], object]:
    path = tmp_path / "hosts.txt"
    path.write_text(text)
    return lambda: ClusterSpec.from_hostfile(path)


BAD_COUNTS = [
    ("workers", lambda _: ClusterSpec.local(workers=-1), "workers=-1", "0..10000"),
    ("workers", lambda _: ClusterSpec.local(workers=True), "workers=True", "0..10000"),
    ("ps", lambda _: ClusterSpec.from_hosts("h:2", ps=-1), "ps=-1", "0..10000"),
    ("ps", lambda _: ClusterSpec.from_hosts("h:2", ps=1.0), "ps=1.0", "0..10000"),
    ("the slot count of entry 'h:0'", lambda _: ClusterSpec.from_hosts("h:0"), "'h:0'",
     "1..10000"),
    ("slots of line 1", lambda p: _hostfile(p, "h slots=0\n")(), "'h slots=0'", "1..10000"),
    ("max_slots of line 1", lambda p: _hostfile(p, "h max_slots=x\n")(), "'h max_slots=x'",
     "1..10000"),
    ("the inst_num of row 1", lambda _: read_pai_table(pai(["worker", "0"])), "'0'", "1..10000"),
    ("n", lambda _: reserve_ports(-1), "n=-1", "0..65535"),
    ("SLURM_NTASKS", lambda _: ClusterSpec.from_slurm(
        {"SLURM_JOB_NODELIST": "n1", "SLURM_NTASKS": "-3"}), "'-3'", "1..40000"),
]


@pytest.mark.parametrize(("field", "make", "received", "expected"), BAD_COUNTS)
def test_every_count_is_checked_with_the_same_wording(
    tmp_path: Path, field: str, make: Callable[[Path], object], received: str, expected: str
) -> None:
    minimum = expected.split("..")[0]
    match = parts(f"{field} must be an integer >= {minimum}.", f"Received: {received}.",
                  f"Expected: an integer in {expected}.", "Fix: ")
    with pytest.raises(ClusterConfigError, match=match):
        make(tmp_path)


def test_check_count_and_parse_count() -> None:
    assert check_count(0, "ps", "x") == 0 and parse_count(" 007 ", "slots", "x") == 7
    with pytest.raises(ClusterConfigError, match=parts(
        "Invalid x: slots must be an integer >= 1.", "Received: slots=0", "Fix: Use 1."
    )):
        check_count(0, "slots", "x", minimum=1, fix="Use 1.")
    with pytest.raises(ClusterConfigError, match=parts("n is larger than 5.", "Received: '9'")):
        parse_count("9", "n", "x", maximum=5)
    with pytest.raises(ClusterConfigError, match=parts("n", LIMIT, "Received: n=<a int too large")):
        check_count(10**5000, "n", "x")
