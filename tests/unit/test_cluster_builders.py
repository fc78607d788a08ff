"""Every `ClusterSpec` builder, and the queries on the spec it builds."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfdist.cluster import (
    ClusterSpec,
    Task,
    expand_nodelist,
    held_ports,
    parse_hosts,
    parse_tasks_per_node,
    read_hostfile,
    read_pai_table,
    release_ports,
    slurm_task,
)
from tfdist.errors import ClusterConfigError

pytestmark = pytest.mark.unit

PAI_TABLE = Path(__file__).resolve().parents[1] / "data" / "pai_task_table.csv"
PS_JOB = "6f1d2b0c8e4a4c1e9b7a0d35"  # ps 2, worker 4, chief 1.
EVAL_JOB = "d2f7b8a9c0e14b6d9a3e5f18"  # chief 1, xComputeWorker 2, evaluator 1.


@pytest.fixture
def release() -> Iterator[list[ClusterSpec]]:
    """Specs appended to this list have their ports released after the test."""
    specs: list[ClusterSpec] = []
    yield specs
    for spec in specs:
        release_ports(spec.ports())


# ------------------------------------------------------------------------------------- queries


def test_tasks_are_in_canonical_order_and_ranks_follow_them() -> None:
    spec = ClusterSpec(evaluator=["e:1"], ps=["p:1", "p:2"], worker=["w:1", "w:2"], chief=["c:1"])
    expected = ["chief:0", "worker:0", "worker:1", "ps:0", "ps:1", "evaluator:0"]
    assert [str(task) for task in spec.tasks()] == expected
    assert [str(spec.task_at_rank(rank)) for rank in range(6)] == expected
    assert spec.num_workers == 3
    assert spec.hosts() == ["c", "w", "p", "e"]
    assert spec.address(Task("ps", 1)) == "p:2" and spec.host("worker:1") == "w"
    assert spec.ports() == [1, 1, 2, 1, 2, 1]


def test_as_dict_omits_empty_roles_and_the_evaluator_unless_asked() -> None:
    spec = ClusterSpec(worker=["w:1"], evaluator=["e:1"])
    assert spec.as_dict() == {"worker": ["w:1"]}
    assert spec.as_dict(include_evaluator=True) == {"worker": ["w:1"], "evaluator": ["e:1"]}


def test_tf_config_never_lists_the_evaluator() -> None:
    spec = ClusterSpec(chief=["c:1"], worker=["w:1"], ps=["p:1"], evaluator=["e:1"])
    training = {"chief": ["c:1"], "worker": ["w:1"], "ps": ["p:1"]}
    for task in spec.tasks():
        assert spec.tf_config(task.type, task.index) == {
            "cluster": training,
            "task": {"type": task.type, "index": task.index},
        }
    assert '"evaluator"' not in spec.tf_config_json("worker", 0)


def test_lists_become_tuples_and_the_spec_is_frozen() -> None:
    spec = ClusterSpec(worker=["w:1"])
    assert spec.worker == ("w:1",)
    with pytest.raises(AttributeError):
        spec.worker = ("x:1",)  # type: ignore[misc]
    assert str(Task.parse("worker:1")) == "worker:1" and Task.parse("chief") == Task("chief", 0)


# --------------------------------------------------------------------------------------- local


def test_local_puts_every_task_on_a_distinct_held_port(release: list[ClusterSpec]) -> None:
    spec = ClusterSpec.local(workers=2, ps=1, chief=True, evaluator=True)
    release.append(spec)
    assert [len(spec.chief), len(spec.worker), len(spec.ps), len(spec.evaluator)] == [1, 2, 1, 1]
    assert spec.hosts() == ["localhost"] and len(set(spec.ports())) == 5
    assert set(spec.ports()) <= set(held_ports())


def test_local_validates_with_the_strategy_and_releases_on_error() -> None:
    before = held_ports()
    with pytest.raises(ClusterConfigError, match="needs a ps task"):
        ClusterSpec.local(workers=2, chief=True, strategy="parameter_server")
    with pytest.raises(ClusterConfigError, match="workers must be an integer >= 0"):
        ClusterSpec.local(workers=-1)
    assert held_ports() == before


def test_local_on_ipv6_loopback(release: list[ClusterSpec]) -> None:
    try:
        spec = ClusterSpec.local(workers=1, host="::1")
    except ClusterConfigError:
        pytest.skip("no IPv6 loopback on this machine")
    release.append(spec)
    assert spec.worker[0].startswith("[::1]:") and spec.hosts() == ["::1"]


# ----------------------------------------------------------------------------------- from_hosts


def test_from_hosts_fills_slots_host_major_in_canonical_order() -> None:
    spec = ClusterSpec.from_hosts("h1:2,h2:2", ps=1, chief=True)
    assert spec.as_dict() == {"chief": ["h1:2222"], "worker": ["h1:2223", "h2:2222"],
                              "ps": ["h2:2223"]}
    assert spec.num_workers == 3 and spec.task_at_rank(3) == Task("ps", 0)


def test_from_hosts_accepts_lists_bare_hosts_ipv6_and_explicit_counts() -> None:
    spec = ClusterSpec.from_hosts(["a", "[::1]:3"], workers=2, evaluator=True, base_port=3000)
    assert spec.as_dict(include_evaluator=True) == {
        "worker": ["a:3000", "[::1]:3000"], "evaluator": ["[::1]:3001"]}
    assert spec.hosts() == ["a", "::1"]


@pytest.mark.parametrize(
    ("hosts", "kwargs", "match"),
    [
        ("h1:2,h2:2", {"workers": 4, "chief": True}, "need 5 slots but the hosts have 4"),
        ("h1:2,h1:1", {}, "host 'h1' is listed more than once.*'h1:3'"),
        ("h1:0", {}, "slot count of entry 'h1:0' must be an integer >= 1.*Fix: Write 'h1:1'"),
        ("h1:x", {}, "slot count of entry 'h1:x' must be an integer >= 1.*Received: 'h1:x'"),
        ("h1,,h2", {}, "empty entry"),
        ("h1:2", {"ps": 1}, None),
        ("h1:2", {"base_port": 65535}, "base_port 65535 with 2 slots on host 'h1' needs ports up"),
        ("h1:2", {"base_port": 0}, r"base_port is not a port number.*1\.\.65535"),
        ("h1:2", {"ps": -1}, "ps must be an integer >= 0"),
        ("h1:2", {"ps": 1, "strategy": "multi_worker"}, "does not use parameter servers"),
    ],
)
def test_from_hosts_refuses_bad_requests(hosts: str, kwargs: dict, match: str | None) -> None:
    if match is None:
        assert ClusterSpec.from_hosts(hosts, **kwargs).as_dict() == {
            "worker": ["h1:2222"], "ps": ["h1:2223"]}
        return
    with pytest.raises(ClusterConfigError, match=match):
        ClusterSpec.from_hosts(hosts, **kwargs)


def test_from_hostfile_reads_comments_blank_lines_and_both_slot_syntaxes(tmp_path: Path) -> None:
    path = tmp_path / "hosts.txt"
    path.write_text("# cluster\n\nnode1:2\nnode2 slots=2 max_slots=4  # gpu box\n   node3\n")
    spec = ClusterSpec.from_hostfile(path, ps=1, chief=True)
    assert spec.as_dict() == {"chief": ["node1:2222"],
                              "worker": ["node1:2223", "node2:2222", "node2:2223"],
                              "ps": ["node3:2222"]}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("node1:2\n# ok\nnode2 slot=2\n", r"hosts.txt.*line 3 has an unknown option 'slot=2'"),
        ("node1:2 slots=3\n", r"line 1 gives the slot count twice"),
        ("node1:-2\n", r"slot count of line 1 must be an integer >= 1.*Received: 'node1:-2'"),
        ("# nothing\n\n", r"it lists no hosts"),
    ],
)
def test_from_hostfile_names_file_and_line_of_a_bad_line(
    tmp_path: Path, text: str, match: str
) -> None:
    path = tmp_path / "hosts.txt"
    path.write_text(text)
    with pytest.raises(ClusterConfigError, match=match):
        ClusterSpec.from_hostfile(path)


def test_from_hostfile_refuses_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ClusterConfigError, match=r"nope.txt.*cannot be read"):
        ClusterSpec.from_hostfile(tmp_path / "nope.txt")


# ---------------------------------------------------------------------------------------- slurm


@pytest.mark.parametrize(
    ("text", "nodes"),
    [
        ("node[01-03,07],gpu-a[1-2],login1",
         ["node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2", "login1"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("rack[1-2]-n[1,3]", ["rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"]),
        ("single", ["single"]),
    ],
)
def test_expand_nodelist(text: str, nodes: list[str]) -> None:
    assert expand_nodelist(text) == nodes


@pytest.mark.parametrize("text", ["n[3-1]", "n[1-2", "n[a-b]", "a,,b", "n[[1]]"])
def test_expand_nodelist_refuses_bad_lists(text: str) -> None:
    with pytest.raises(ClusterConfigError, match="Slurm environment: the node list"):
        expand_nodelist(text)


def test_parse_tasks_per_node() -> None:
    assert parse_tasks_per_node("2(x3),1", 4) == [2, 2, 2, 1]
    assert parse_tasks_per_node("4", 1) == [4]
    with pytest.raises(ClusterConfigError, match="gives 4 counts for 5 nodes"):
        parse_tasks_per_node("2(x3),1", 5)
    with pytest.raises(ClusterConfigError, match="invalid item '2x3'"):
        parse_tasks_per_node("2x3", 1)


SLURM_ENV = {"SLURM_JOB_NODELIST": "gpu[01-02],cpu7", "SLURM_TASKS_PER_NODE": "2(x2),1"}


def test_from_slurm_lays_tasks_out_on_nodes() -> None:
    spec = ClusterSpec.from_slurm(SLURM_ENV, ps=1, chief=True)
    assert spec.as_dict() == {"chief": ["gpu01:2222"],
                              "worker": ["gpu01:2223", "gpu02:2222", "gpu02:2223"],
                              "ps": ["cpu7:2222"]}


@pytest.mark.parametrize(
    ("env", "workers"),
    [
        ({"SLURM_NODELIST": "n[1-2]", "SLURM_NTASKS_PER_NODE": "3"}, 6),
        ({"SLURM_NODELIST": "n[1-2]", "SLURM_NTASKS": "5"}, 5),
        ({"SLURM_NODELIST": "n[1-3]", "SLURM_NTASKS": "2"}, 2),
    ],
)
def test_from_slurm_fallback_variables(env: dict, workers: int) -> None:
    spec = ClusterSpec.from_slurm(env)
    assert len(spec.worker) == workers and spec.worker[0] == "n1:2222"
    if "SLURM_NTASKS" in env and workers == 5:
        assert spec.worker == ("n1:2222", "n1:2223", "n1:2224", "n2:2222", "n2:2223")


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({}, r"SLURM_JOB_NODELIST \(or SLURM_NODELIST\) is not set.*srun or sbatch"),
        ({"SLURM_JOB_NODELIST": "n1"}, r"SLURM_TASKS_PER_NODE .* is not set.*srun"),
        ({"SLURM_JOB_NODELIST": "n1", "SLURM_NTASKS": "two"},
         r"SLURM_NTASKS must be an integer >= 1.*'two'"),
    ],
)
def test_from_slurm_names_missing_variables(env: dict, match: str) -> None:
    with pytest.raises(ClusterConfigError, match=match):
        ClusterSpec.from_slurm(env)


def test_from_slurm_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SLURM_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLURM_PROCID", "4")
    assert ClusterSpec.from_slurm().num_workers == 5
    assert slurm_task(ps=1, chief=True) == Task("ps", 0)


def test_slurm_task_follows_procid_through_the_layout() -> None:
    tasks = [slurm_task({**SLURM_ENV, "SLURM_PROCID": str(rank)}, ps=1, chief=True)
             for rank in range(5)]
    assert [str(task) for task in tasks] == ["chief:0", "worker:0", "worker:1", "worker:2", "ps:0"]
    with pytest.raises(ClusterConfigError, match=r"rank is out of range.*Received: 5"):
        slurm_task({**SLURM_ENV, "SLURM_PROCID": "5"})
    with pytest.raises(ClusterConfigError, match="SLURM_PROCID is not set"):
        slurm_task(SLURM_ENV)


# ------------------------------------------------------------------------------------------ PAI


def test_pai_table_fixture_in_the_trace_form(release: list[ClusterSpec]) -> None:
    spec = ClusterSpec.from_pai_table(PAI_TABLE, PS_JOB, strategy="parameter_server")
    release.append(spec)
    assert [len(spec.chief), len(spec.worker), len(spec.ps)] == [1, 4, 2]
    job = read_pai_table(str(PAI_TABLE), EVAL_JOB)
    assert job.instances == {"chief": 1, "worker": 2, "evaluator": 1}
    assert job.plan_cpu == {"chief": 400.0, "worker": 400.0, "evaluator": 200.0}
    assert job.plan_gpu == {"chief": 25.0, "worker": 25.0, "evaluator": None}


def test_pai_table_with_several_jobs_needs_a_job_name() -> None:
    match = r"several jobs.*5 jobs: 6f1d2b.*Fix: Pass job_name"
    with pytest.raises(ClusterConfigError, match=match):
        read_pai_table(PAI_TABLE)
    with pytest.raises(ClusterConfigError, match=r"job 'nope' is not in it"):
        read_pai_table(PAI_TABLE, "nope")


def test_pai_table_refuses_unknown_task_names() -> None:
    with pytest.raises(ClusterConfigError, match=r"row 9 has an unknown task_name 'JupyterTask'"
                                                 r".*xtensorflow, tensorflow, PyTorchWorker"):
        read_pai_table(PAI_TABLE, "e81c3f5a6b7d4c2e9f0a1b23")


def test_pai_table_with_a_header_row(tmp_path: Path, release: list[ClusterSpec]) -> None:
    path = tmp_path / "table.csv"
    path.write_text("job_name,task_name,inst_num,status,plan_cpu,plan_gpu\n"
                    "j1,WORKER,3.0,Running,600,100\nj1,Ps,1,Running,200,\n")
    spec = ClusterSpec.from_pai_table(path)
    release.append(spec)
    assert (len(spec.worker), len(spec.ps), spec.hosts()) == (3, 1, ["localhost"])
    assert read_pai_table(path).plan_gpu == {"worker": 100.0, "ps": None}


def test_pai_table_with_five_columns_and_rows_in_memory(release: list[ClusterSpec]) -> None:
    rows = [["j2", "xtensorflow", "2.0", "800", "50"], ["j2", "chief", "1.0", "800", "50"], []]
    spec = ClusterSpec.from_pai_table(rows, "j2", strategy="multi_worker")
    release.append(spec)
    assert spec.num_workers == 3 and len(spec.chief) == 1
    mapping_rows = [{"job_name": "j3", "task_name": "PyTorchWorker", "inst_num": "2"}]
    assert read_pai_table(mapping_rows).instances == {"worker": 2}


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ([["j", "worker", "1.5", "1", "1"]], r"inst_num of row 1 must be an integer >= 1.*'1.5'"),
        ([["j", "worker", "0", "1", "1"]], r"inst_num of row 1 must be an integer >= 1"),
        ([["j", "worker", "1", "1"]], r"row 1 has 4 columns.*5 or 10"),
        ([["j", "chief", "2", "1", "1"]], r"has 2 chief tasks; there can be only one chief"),
        ([["job_name", "task_name"], ["j", "worker"]], r"row 2 has no inst_num column"),
        ([["job_name", "task_name", "inst_num"]], r"it holds no task rows"),
    ],
)
def test_pai_table_refuses_bad_rows(rows: list, match: str) -> None:
    with pytest.raises(ClusterConfigError, match=match):
        ClusterSpec.from_pai_table(rows)


def test_pai_table_refuses_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ClusterConfigError, match=re.escape("cannot be read")):
        read_pai_table(tmp_path / "missing.csv")


# ------------------------------------------------------------------------------------- ps-only jobs


PS_ONLY = (r"a cluster with ps tasks needs a chief or workers to train.*Received: \{'ps': \[.*"
           r"Expected: at least one chief or worker task.*Fix: Add workers or a chief")


def test_ps_only_jobs_are_refused_by_every_builder() -> None:
    before = held_ports()
    with pytest.raises(ClusterConfigError, match=PS_ONLY):
        ClusterSpec.from_hosts("h:2", workers=0, ps=1)
    with pytest.raises(ClusterConfigError, match=PS_ONLY):
        ClusterSpec.from_pai_table([["j", "ps", "2", "600", ""]])
    with pytest.raises(ClusterConfigError, match=PS_ONLY):
        ClusterSpec.local(workers=0, ps=1)
    with pytest.raises(ClusterConfigError, match=PS_ONLY):
        ClusterSpec(ps=["h:1"], evaluator=["h:2"])
    assert held_ports() == before
    assert ClusterSpec.from_hosts("h:2", workers=0, ps=1, chief=True).ps == ("h:2223",)


# ---------------------------------------------------------------------------------- PAI task groups


@pytest.mark.parametrize("second", ["worker", "WORKER"])
def test_pai_table_refuses_a_task_group_listed_twice(second: str) -> None:
    rows = [["j", "worker", "2", "600", "50"], ["j", "ps", "1", "600", ""],
            ["j", second, "2", "600", "50"]]
    match = (rf"row 3 repeats task group '{second}' of job 'j', already given in row 1"
             r".*Received: \{'job_name': 'j', 'task_name': '" + second +
             r"'.*Fix: Remove the duplicate row, or merge it into row 1")
    with pytest.raises(ClusterConfigError, match=match):
        read_pai_table(rows)


def test_pai_table_adds_different_task_groups_of_one_role() -> None:
    rows = [["j", "worker", "2", "600", "50"], ["j", "tensorflow", "1", "800", "25"]]
    job = read_pai_table(rows)
    assert job.instances == {"worker": 3} and job.plan_cpu == {"worker": 800.0}


# ------------------------------------------------------------------------------- Slurm distribution

BLOCK_FIX = "Fix: Start the tasks with srun (it sets SLURMD_NODENAME and SLURM_LOCALID"


@pytest.mark.parametrize(("procid", "node", "local", "task"), [
    # srun --distribution=cyclic on SLURM_ENV (gpu01: 2, gpu02: 2, cpu7: 1): ranks go round the
    # nodes, so rank 1 is gpu02's first task; the slot, not the rank, decides the task.
    ("0", "gpu01", "0", Task("chief", 0)), ("1", "gpu02", "0", Task("worker", 1)),
    ("2", "cpu7", "0", Task("ps", 0)), ("3", "gpu01", "1", Task("worker", 0)),
    ("4", "GPU02", "1", Task("worker", 2)),
])
def test_slurm_task_is_found_from_its_node_and_local_id_under_any_distribution(
    procid: str, node: str, local: str, task: Task
) -> None:
    env = {**SLURM_ENV, "SLURM_PROCID": procid, "SLURMD_NODENAME": node, "SLURM_LOCALID": local,
           "SLURM_DISTRIBUTION": "cyclic"}
    assert slurm_task(env, ps=1, chief=True) == task


def test_slurm_task_on_a_node_outside_the_list_or_past_its_count_is_refused() -> None:
    env = {**SLURM_ENV, "SLURMD_NODENAME": "gpu09", "SLURM_LOCALID": "0"}
    with pytest.raises(ClusterConfigError, match=r"this task's node 'gpu09' is not in the "
                       r"allocation's node list\. Received: SLURMD_NODENAME='gpu09'.*Expected: one"
                       r" of \['gpu01', 'gpu02', 'cpu7'\].*Fix: Read SLURM_JOB_NODELIST"):
        slurm_task(env)
    env = {**SLURM_ENV, "SLURMD_NODENAME": "cpu7", "SLURM_LOCALID": "1"}
    with pytest.raises(ClusterConfigError, match=r"SLURM_LOCALID 1 is beyond the 1 task\(s\) of "
                       r"node 'cpu7'.*Expected: 0\.\.0"):
        slurm_task(env)


@pytest.mark.parametrize("value", ["cyclic", "cyclic:block", "plane=2", "arbitrary",
                                   "Cyclic,Pack"])
def test_without_node_and_local_id_a_distribution_that_is_not_block_is_refused(
    value: str
) -> None:
    env = {**SLURM_ENV, "SLURM_PROCID": "0", "SLURM_DISTRIBUTION": value}
    match = (rf"SLURM_DISTRIBUTION '{re.escape(value)}' does not lay ranks out block-wise.*"
             rf"Received: SLURM_DISTRIBUTION='{re.escape(value)}'.*" + re.escape(BLOCK_FIX))
    with pytest.raises(ClusterConfigError, match=match):
        slurm_task(env)
    # The layout itself does not depend on the distribution.
    assert ClusterSpec.from_slurm(env) == ClusterSpec.from_slurm(SLURM_ENV)


@pytest.mark.parametrize("value", ["block", "block:cyclic", "block:block,NoPack", "*:cyclic", ""])
def test_slurm_distribution_that_is_block_is_accepted(value: str) -> None:
    env = {**SLURM_ENV, "SLURM_PROCID": "2", "SLURM_DISTRIBUTION": value}
    assert slurm_task(env, chief=True) == Task("worker", 1)


# ------------------------------------------------------------------------- hostfiles and host names


def test_hostfile_with_a_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "hosts.txt"
    path.write_bytes("node1:2\r\nnode2\r\n".encode("utf-8-sig"))
    assert read_hostfile(path) == [("node1", 2), ("node2", 1)]
    assert ClusterSpec.from_hostfile(path).worker[0] == "node1:2222"


@pytest.mark.parametrize(
    ("text", "slots"),
    [("node1 max_slots=4\n", 1), ("node1 slots=2 max_slots=2\n", 2), ("node1:3 max_slots=8\n", 3)],
)
def test_hostfile_max_slots_is_a_cap_on_slots(tmp_path: Path, text: str, slots: int) -> None:
    path = tmp_path / "hosts.txt"
    path.write_text(text)
    assert read_hostfile(path) == [("node1", slots)]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("node1 slots=4 max_slots=2\n",
         r"line 1 gives 4 slots, more than its max_slots=2\. Received: 'node1 slots=4 max_slots=2'"
         r".*Fix: Write 'node1 slots=2 max_slots=2', or raise max_slots"),
        ("node1:3 max_slots=2\n", r"line 1 gives 3 slots, more than its max_slots=2"),
        ("node1 slots=2 slots=3\n", r"line 1 gives slots twice.*Fix: Keep one slots=N"),
        ("node1 max_slots=100000\n", r"max_slots of line 1 is larger than 10000"),
    ],
)
def test_hostfile_refuses_slots_above_max_slots(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "hosts.txt"
    path.write_text(text)
    with pytest.raises(ClusterConfigError, match=match):
        read_hostfile(path)


BAD_HOSTS = [
    ("-oProxyCommand=touch:1", "has a host that starts with '-' (ssh would read it as an option)"),
    ("-x", "has a host that starts with '-'"),
    ("[-1]:2", "has a host that starts with '-'"),
    ("h\x07:1", "has a host with whitespace or a control character"),
    ("\ufeffh:1", "has a host with whitespace or a control character"),
    ("h\u200b", "has a host with whitespace or a control character"),
    ("n1;touch${IFS}x:2", "has a host that is not a hostname or IP address"),
    ("$(id):2", "has a host that is not a hostname or IP address"),
    ("`id`", "has a host that is not a hostname or IP address"),
    ("user@node1:2", "has a host that is not a hostname or IP address"),
    ("[::g]:2", "has a host that is not a hostname or IP address"),
    ("n1..x:1", "has a host that is not a hostname or IP address"),
]
HOST_FIX = ("Fix: Write the machine's hostname or IP address, without spaces, shell characters "
            "or a leading '-'.")


@pytest.mark.parametrize("entry", ["node-01:2", "n1.cluster.local:1", "10.0.0.7:4", "[::1]:2",
                                   "[fe80::1%eth0]:1", "job_worker-0:1", "localhost"])
def test_host_lists_accept_hostnames_and_ip_addresses(entry: str) -> None:
    assert parse_hosts(entry)[0][1] >= 1


@pytest.mark.parametrize(("entry", "problem"), BAD_HOSTS)
def test_host_lists_and_hostfiles_refuse_option_like_or_control_hosts(
    tmp_path: Path, entry: str, problem: str
) -> None:
    listed = rf"entry {re.escape(repr(entry))} {re.escape(problem)}.*Received: " + re.escape(
        repr(entry)) + ".*" + re.escape(HOST_FIX)
    with pytest.raises(ClusterConfigError, match=listed):
        parse_hosts(entry)
    with pytest.raises(ClusterConfigError, match=listed):
        ClusterSpec.from_hosts([entry])
    path = tmp_path / "hosts.txt"
    path.write_text(f"ok:1\n{entry}\n", encoding="utf-8")
    with pytest.raises(ClusterConfigError, match=r"line 2 " + re.escape(problem)):
        read_hostfile(path)
