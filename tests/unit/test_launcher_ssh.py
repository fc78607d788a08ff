"""--hosts/--hostfile planning and the ssh command line of remote tasks (no ssh is run)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tfdist.errors import ClusterConfigError
from tfdist.launcher import cli
from tfdist.launcher.hosts.layout import HostOptions
from tfdist.launcher.hosts.ssh import (
    SshOptions,
    env_payload,
    forwarded_env,
    is_local_host,
    ssh_command,
)
from tfdist.launcher.placement import place
from tfdist.launcher.plan import JobOptions, plan_job

NASTY = {"TF_CONFIG": '{"task": {"type": "worker", "index": 1}}', "X": "it's $HOME; `id` \"q\""}


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('train')\n")
    return str(path)


def test_ssh_command_checks_host_keys_and_puts_no_environment_on_the_command_line():
    argv = ssh_command("n2", ["py", "t.py"], SshOptions(port=2022, identity="/k/id"),
                       cwd="/my dir", ssh="/usr/bin/ssh")
    assert argv[:7] == ("/usr/bin/ssh", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
                        "-o", "StrictHostKeyChecking=yes")
    assert argv[7:13] == ("-p", "2022", "-i", "/k/id", "--", "n2")
    words = shlex.split(argv[13])  # what the remote shell sees
    assert words == ["cd", "/my dir", "&&", "exec", sys.executable, "-m",
                     "tfdist.launcher.hosts.remote", "--env-stdin", "--", "py", "t.py"]


def test_host_key_options_known_hosts_file_or_explicitly_off():
    strict = SshOptions(known_hosts="/k/known").args()
    assert strict == ("-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=/k/known")
    assert SshOptions(check_host_keys=False).args() == (
        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null")


def test_ssh_command_without_port_or_identity_leaves_them_to_ssh():
    argv = ssh_command("[::1]", ["true"], SshOptions(), cwd="/", ssh="ssh")
    assert "-p" not in argv and "-i" not in argv and argv[-2] == "::1"


def test_remote_half_survives_a_real_shell_and_gets_its_env_from_stdin(tmp_path):
    """Runs the remote half through bash here: env values and arguments arrive unchanged."""
    probe = "import json, os, sys; print(json.dumps([os.environ['X'], os.getcwd(), sys.argv[1:]]))"
    args = [sys.executable, "-c", probe, "a b", "$HOME", "it's"]
    (tmp_path / "my dir").mkdir()
    argv = ssh_command("n2", args, SshOptions(), cwd=str(tmp_path / "my dir"), ssh="ssh")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run(["bash", "-c", argv[-1]], capture_output=True, text=True, timeout=60,
                         input=env_payload(NASTY), check=True, env=env).stdout
    assert json.loads(out) == [NASTY["X"], str(tmp_path / "my dir"), ["a b", "$HOME", "it's"]]
    assert NASTY["X"] not in " ".join(argv)


def test_bad_env_name_is_refused_with_a_fix():
    with pytest.raises(ClusterConfigError, match=r"Received: 'A B'.*Fix: Rename"):
        env_payload({"A B": "1"})


def test_forwarded_env_keeps_tfdist_and_python_path_and_named_variables_only():
    env = {"PYTHONPATH": "/src", "TFDIST_RESULT_DIR": "/r", "HOME": "/root", "PATH": "/bin",
           "TF_VAR_db_password": "s3cret", "TF_TOKEN_app_terraform_io": "t0ken",
           "AWS_SECRET_ACCESS_KEY": "k", "NCCL_DEBUG": "INFO"}
    assert forwarded_env(env) == {"PYTHONPATH": "/src", "TFDIST_RESULT_DIR": "/r"}
    assert forwarded_env(env, names=["NCCL_DEBUG"])["NCCL_DEBUG"] == "INFO"


@pytest.mark.parametrize(("host", "local"), [("localhost", True), ("127.0.0.1", True),
                                             ("::1", True), ("198.51.100.1", False), ("n2", False)])
def test_is_local_host(host, local):
    assert is_local_host(host) is local


def _dry_run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[dict]:
    assert cli.main(["--dry-run", *argv]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_dry_run_on_hosts_gives_host_addresses_and_ssh_for_remote_tasks(script, capsys, tmp_path):
    key = tmp_path / "id"
    key.write_text("key")
    lines = _dry_run(capsys, ["--hosts", "198.51.100.1:1,198.51.100.2:2", "--ps", "1",
                              "--workers", "1",
                              "--base-port", "3000", "--ssh-port", "2022", "--ssh-identity",
                              str(key), script])
    cluster = {"chief": ["198.51.100.1:3000"], "worker": ["198.51.100.2:3000"],
               "ps": ["198.51.100.2:3001"]}
    assert [line["host"] for line in lines] == ["198.51.100.1", "198.51.100.2", "198.51.100.2"]
    for line in lines:
        assert line["tf_config"]["cluster"] == cluster
        command = line["command"]
        assert command[0].endswith("ssh") and command[7:13] == ["-p", "2022", "-i", str(key),
                                                               "--", line["host"]]
        remote = shlex.split(command[-1])
        assert remote[:2] == ["cd", os.getcwd()]
        assert "TF_CONFIG" not in command[-1]  # it goes over the ssh channel, not argv
    assert shlex.split(lines[0]["command"][-1])[-2:] == ["-u", script]
    assert shlex.split(lines[1]["command"][-1])[-3:] == ["-u", "-m", "tfdist.server"]


def test_tasks_on_this_machine_start_without_ssh(script, capsys):
    lines = _dry_run(capsys, ["--hosts", "localhost:2", script])
    assert [line["command"] for line in lines] == [[sys.executable, "-u", script]] * 2
    assert lines[1]["tf_config"]["cluster"] == {"worker": ["localhost:2222", "localhost:2223"]}


def test_dry_run_horovod_on_hosts_shows_each_rank_with_its_host(script, capsys):
    lines = _dry_run(capsys, ["--strategy", "horovod", "--workers", "3", "--hosts", "h1:2,h2:2",
                              script])
    assert [(line["task"]["index"], line["host"]) for line in lines] == [
        (0, "h1"), (1, "h1"), (2, "h2")]


def test_horovodrun_gets_hosts_ssh_port_and_identity(script):
    hosts = HostOptions(hostfile=None, hosts="h1:2,h2:2", ssh=SshOptions(port=2022, identity="/k"))
    plan = place(plan_job(JobOptions(script, strategy="horovod", workers=4, hosts=hosts)))
    command = plan.tasks[0].command
    assert command[1:10] == ("-np", "4", "-H", "h1:2,h2:2", "-p", "2022",
                             "--ssh-identity-file", "/k", "--gloo")


def test_horovodrun_on_remote_hosts_names_the_interface_and_wraps_each_rank(script, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "{}")
    hosts = HostOptions(hosts="198.51.100.7:1,198.51.100.8:1", network_interface="eth9")
    plan = place(plan_job(JobOptions(script, strategy="horovod", workers=2, hosts=hosts)))
    command = plan.tasks[0].command
    assert command[5:8] == ("--network-interfaces", "eth9", "--gloo")
    assert command[8:12] == (sys.executable, "-m", "tfdist.launcher.hosts.remote", "--")
    assert command[12:] == (sys.executable, "-u", script)
    assert "TF_CONFIG" not in plan.tasks[0].environ()  # horovodrun passes its env to the ranks


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--hostfile", "/no/such/hostfile"],
         "Invalid hostfile '/no/such/hostfile': it cannot be read"),
        (["--hosts", "h1:1", "--workers", "3"], "the tasks need 3 slots but the hosts have 1"),
        (["--hosts", "localhost:1,h2:1"], "'localhost' is a loopback name"),
        (["--hosts", "h1:2", "--hostfile", "f"], "--hosts and --hostfile were both given"),
        (["--ssh-port", "22"], "--ssh-port only applies with --hosts or --hostfile"),
        (["--network-interface", "eth0"],
         "--network-interface only applies with --hosts or --hostfile"),
        (["--hosts", "h1:2", "--ssh-identity", "/no/key"], "--ssh-identity file not found"),
        (["--hosts", "h1:2", "--ssh-port", "0"], "--ssh-port must be in 1..65535"),
        (["--hosts", "n1;touch${IFS}x:2"], "has a host that is not a hostname or IP address"),
        (["--hosts", "$(id):2", "--dry-run"], "has a host that is not a hostname or IP address"),
    ],
)
def test_bad_host_input_exits_2_with_one_line(argv, message, script, capsys):
    try:
        status = cli.main([*argv, script])
    except SystemExit as exit_info:
        status = exit_info.code
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and err[-1].startswith("tfdist-launch: error:")


def test_missing_ssh_is_an_error_before_anything_starts(script, capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert cli.main(["--hosts", "h1:1,h2:1", script]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tfdist-launch: error: The ssh client is needed") and "\n" not in err


def test_a_base_port_in_use_on_this_machine_is_refused_before_start(script, capsys):
    import socket

    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code = cli.main(["--dry-run", "--hosts", "localhost:2", "--base-port", str(port - 1),
                         "--workers", "2", script])
    assert code == 2
    err = capsys.readouterr().err
    assert f"Port {port} of task worker:1 on localhost is already in use" in err
    assert "Fix: pass another --base-port" in err
