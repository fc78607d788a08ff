"""tfdist-launch --ray: its arguments, --dry-run, and the Gloo rendezvous of Horovod ranks
(no Ray cluster; the runs are in tests/multiprocess/test_ray_runner.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tfdist.errors import MissingDependencyError
from tfdist.horovod.rendezvous import GlooRendezvous, rank_order
from tfdist.launcher import cli
from tfdist.launcher.ray import gang as ray_runner


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('train')\n")
    return str(path)


def test_ray_without_an_address_means_auto(script):
    options = cli.parse_args(["--workers", "2", "--ray", "--", script]).plan.options.ray
    assert (options.address, options.cpus_per_task, options.placement) == ("auto", 1.0, "SPREAD")
    assert cli.parse_args(["--ray", "10.0.0.1:6379", script]).plan.options.ray.address == (
        "10.0.0.1:6379")
    assert cli.parse_args([script]).plan.options.ray is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ray", "auto", "--hosts", "h1:2"],
         "--ray was given with --hosts/--hostfile: Ray places"),
        (["--ray"], "--ray took '{script}' as the cluster's ADDRESS, and no SCRIPT is left. Fix: "
         "name the address before the script (--ray auto {script})"),
        (["--ray-cpus-per-task", "0", "--ray", "auto"],
         "--ray-cpus-per-task must be more than 0. Received: 0.0. Fix: e.g. --ray-cpus-per-task"),
        (["--ray-gang-timeout", "-1", "--ray", "auto"],
         "--ray-gang-timeout must be more than 0 seconds"),
        (["--env", "HOME"], "--env only applies with --hosts or --hostfile"),
    ],
)
def test_bad_ray_arguments_are_refused_with_the_fix(capsys, script, argv, message):
    with pytest.raises(SystemExit) as info:
        cli.parse_args([*argv, script])
    assert info.value.code == 2
    assert message.format(script=script) in capsys.readouterr().err


def test_env_names_reach_the_ray_options(script, monkeypatch):
    monkeypatch.setenv("MY_SETTING", "on")
    options = cli.parse_args(["--env", "MY_SETTING", "--ray", "auto", script]).plan.options
    assert options.ray.env_names == ("MY_SETTING",)


def _dry_run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[dict]:
    assert cli.main(["--dry-run", "--ray", "auto", *argv]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_dry_run_prints_one_bundle_per_task(capsys, script):
    lines = _dry_run(capsys, ["--ps", "1", "--workers", "2", "--ray-cpus-per-task", "0.5",
                              "--ray-placement", "PACK", script])
    assert [(t["task"], t["kind"]) for t in lines] == [
        ("chief:0", "main"), ("worker:0", "service"), ("worker:1", "service"),
        ("ps:0", "service")]
    assert lines[0]["command"] == [sys.executable, "-u", script]
    assert lines[3]["command"][-2:] == ["-m", "tfdist.server"]
    assert all(t["bundle"] == {"CPU": 0.5} and t["placement"] == "PACK" for t in lines)


def test_dry_run_of_horovod_lists_ranks_without_tf_config(capsys, script):
    lines = _dry_run(capsys, ["--strategy", "horovod", "--workers", "3", script])
    assert [t["task"] for t in lines] == ["rank:0", "rank:1", "rank:2"]
    assert all(t["tf_config"] is None for t in lines)


def test_missing_ray_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'tfdist\[ray\]'"):
        ray_runner._ray()


def test_ranks_go_host_major():
    assert rank_order(["a", "b", "a", "b"]) == [0, 2, 1, 3]
    assert rank_order(["x"]) == [0]


@pytest.mark.skipif(importlib.util.find_spec("horovod") is None,
                    reason="Horovod is not installed; run: bash launch/setup.sh")
def test_gloo_rendezvous_listens_on_its_address_only_and_numbers_the_ranks():
    with GlooRendezvous.for_hosts("127.0.0.1", ["a", "b", "a"]) as rendezvous:
        port = rendezvous.port
        assert rendezvous._server.server_address == ("127.0.0.1", port)
        envs = [rendezvous.rank_env(rank, "lo") for rank in range(3)]
    assert [(e["HOROVOD_HOSTNAME"], e["HOROVOD_LOCAL_RANK"], e["HOROVOD_CROSS_RANK"])
            for e in envs] == [("a", "0", "0"), ("a", "1", "0"), ("b", "0", "1")]
    assert {e["HOROVOD_SIZE"] for e in envs} == {"3"}
    assert [e["HOROVOD_LOCAL_SIZE"] for e in envs] == ["2", "2", "1"]
    assert envs[0]["HOROVOD_GLOO_RENDEZVOUS_PORT"] == str(port)
    assert envs[0]["HOROVOD_GLOO_IFACE"] == "lo"
