"""``--min-workers``/``--max-workers``: checks before start, the plan, ``--dry-run``, the discovery
script tfdist writes, and the loopback addresses of the private network (no Horovod job here:
``tests/horovod/test_horovod_elastic.py`` runs one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfdist.core.registry import strategy_traits
from tfdist.launcher import cli
from tfdist.launcher.horovodrun.elastic import HOSTS_FILE_ENV, Discovery, write_hosts
from tfdist.launcher.placement import place
from tfdist.launcher.plan import JobOptions, plan_job

pytestmark = pytest.mark.unit

ELASTIC = ["--strategy", "horovod", "--min-workers", "1", "--max-workers", "3"]


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('train')\n")
    return str(path)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--strategy", "horovod", "--min-workers", "1"],
         "--min-workers 1 was given without --max-workers. Received: --min-workers 1. Expected: "
         "both"),
        (["--strategy", "horovod", "--max-workers", "2"], "Fix: add --min-workers"),
        (["--strategy", "multi_worker", "--min-workers", "1", "--max-workers", "2"],
         "--min-workers 1 --max-workers 2 was given with --strategy multi_worker, whose job "
         "cannot change size while it runs"),
        (["--strategy", "horovod", "--min-workers", "0", "--max-workers", "2"],
         "--min-workers must be at least 1. Received: 0. Fix: e.g. --min-workers 1"),
        (["--strategy", "horovod", "--workers", "3", "--min-workers", "1", "--max-workers", "2"],
         "--workers 3 is outside --min-workers 1 .. --max-workers 2. Received: --workers 3"),
        (["--strategy", "horovod", "--workers", "2", "--min-workers", "3", "--max-workers", "4"],
         "Expected: min <= workers <= max"),
        (["--strategy", "horovod", "--min-workers", "1", "--max-workers", "300"],
         "--max-workers must be at most 254 on one machine"),
        ([*ELASTIC, "--mpi"], "Horovod's elastic mode runs over Gloo only. Fix: drop --mpi"),
        ([*ELASTIC, "--network", "host"], "Fix: drop --network host"),
        ([*ELASTIC, "--hosts", "localhost:2"], "this machine only. Fix: drop --hosts"),
        ([*ELASTIC, "--export", "mpijob"], "--export cannot carry them"),
        ([*ELASTIC, "--ray", "127.0.0.1:6379"], "--ray cannot carry them"),
    ],
)
def test_bad_elastic_arguments_are_refused_before_start(argv, message, script, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--dry-run", *argv, script])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("tfdist-launch: error:") and message in err


def test_only_horovod_is_elastic():
    assert strategy_traits("horovod").elastic
    assert not any(strategy_traits(name).elastic
                   for name in ("default", "mirrored", "multi_worker", "parameter_server",
                                "pipeline"))


def test_dry_run_shows_the_elastic_horovodrun_and_removes_its_directory(script, capsys):
    assert cli.main(["--dry-run", *ELASTIC, "--workers", "2", script, "--lr", "1"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    ranks, runner = lines[:-1], lines[-1]
    assert [r["host"] for r in ranks] == ["127.0.1.1", "127.0.1.2"]
    assert runner["elastic"]["min_workers"] == 1 and runner["elastic"]["max_workers"] == 3
    assert runner["elastic"]["slots"] == ["127.0.1.1", "127.0.1.2", "127.0.1.3"]
    command = runner["command"]
    hosts_file = runner["elastic"]["hosts_file"]
    discover = command[command.index("--host-discovery-script") + 1]
    assert command[1:7] == ["-np", "2", "--min-np", "1", "--max-np", "3"]
    assert command[command.index("--network-interfaces") + 1] == "lo"
    assert command[-3:] == [script, "--lr", "1"] and "--gloo" in command and "-H" not in command
    assert all(r["env"][HOSTS_FILE_ENV] == hosts_file for r in [*ranks, runner])
    assert Path(discover).parent == Path(hosts_file).parent
    assert not Path(hosts_file).parent.exists()  # released after the dry run


def test_discovery_script_prints_the_hosts_file_as_it_is_rewritten():
    placement = place(plan_job(JobOptions("t.py", strategy="horovod", workers=2,
                                          min_workers=1, max_workers=3)))
    discovery = placement.discovery
    assert discovery is not None and placement.loopback_addresses == (
        "127.0.1.1", "127.0.1.2", "127.0.1.3")
    try:
        def discovered() -> list[str]:
            result = subprocess.run(discovery.script, shell=True, capture_output=True, text=True,
                                    timeout=10, check=True)
            return result.stdout.split()

        assert discovered() == ["127.0.1.1:1", "127.0.1.2:1"]
        write_hosts(discovery.hosts_file, ["127.0.1.1:1"])
        assert discovered() == ["127.0.1.1:1"]
        assert sorted(os.listdir(discovery.directory)) == ["discover.sh", "hosts"]
    finally:
        placement.release()
    assert not Path(discovery.directory).exists()


def test_discovery_directory_is_private():
    discovery = Discovery(["127.0.1.1:1"])
    try:
        assert os.stat(discovery.directory).st_mode & 0o077 == 0
    finally:
        discovery.remove()


def test_private_network_holds_the_slots_loopback_addresses():
    from tfdist.launcher.local.netns import NetworkIsolationError, PrivateNetwork

    try:
        network = PrivateNetwork(("127.0.1.1", "127.0.1.2")).start()
    except NetworkIsolationError as err:
        pytest.skip(f"no private network namespace here: {err}")
    try:
        # What horovodrun asks to decide that a host is this machine (psutil: a Horovod need).
        probe = ("import json, psutil, socket; print(json.dumps([a.address for a in "
                 "psutil.net_if_addrs()['lo'] if a.family == socket.AF_INET]))")
        result = subprocess.run([sys.executable, "-c", probe],
                                preexec_fn=network.join, capture_output=True, text=True,
                                timeout=30, check=True)
    finally:
        network.close()
    assert json.loads(result.stdout) == ["127.0.0.1", "127.0.1.1", "127.0.1.2"]
