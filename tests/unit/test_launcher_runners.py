"""The runner registry: a runner added from outside joins ``tfdist-launch`` whole (its arguments in
``--help``, its checks, its options, its dry run and its run), with no edit anywhere else.

Two ways to add one, each counted here as what it costs: a record registered from a module of
your own (`register_runner`, one line), or a file shipped with tfdist plus one `BUILT_IN` line.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfdist.launcher import arguments, cli, runners
from tfdist.launcher.plan import JobPlan
from tfdist.launcher.runners import Runner

pytestmark = pytest.mark.unit

TOY_FILE = '''
"""A toy Kubernetes-like runner: one file."""
import argparse, json
from tfdist.launcher.runners import Runner, environment_default

def add_arguments(parser):
    group = parser.add_argument_group("toy (a cluster of pods)")
    group.add_argument("--toy-context", default=environment_default("TOY_CONTEXT"),
                       help="the toy cluster (env TFDIST_LAUNCH_TOY_CONTEXT)")
    group.add_argument("--toy-pods-per-node", type=int, default=None)

def problem(args):
    if args.toy_pods_per_node is not None and args.toy_context is None:
        return "--toy-pods-per-node only applies with --toy-context. Fix: add --toy-context"
    if args.toy_pods_per_node is not None and args.toy_pods_per_node < 1:
        return f"--toy-pods-per-node must be 1 or more. Received: {args.toy_pods_per_node}"
    return None

def options(args):
    return {"context": args.toy_context, "per_node": args.toy_pods_per_node or 1}

def describe(plan, options):
    return [json.dumps({"pod": f"{task.type}-{task.index}", "context": options["context"],
                        "node": task.index // options["per_node"],
                        "command": list(plan.task_argv(task.type))}) for task in plan.tasks()]

RUNS = []

def run(plan, options):
    RUNS.append((plan, options))
    return 7

RUNNER = Runner("toy", describe=describe, run=run, add_arguments=add_arguments,
                chosen=lambda args: args.toy_context is not None, environment=("TOY_CONTEXT",),
                options=options, problem=problem)
'''


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('train')\n")
    return str(path)


@pytest.fixture(params=["register_runner", "built_in_line"])
def toy(request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """The toy runner's module, added one of the two ways; removed again after the test."""
    (tmp_path / "toy_runner.py").write_text(TOY_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("toy_runner", None)
    if request.param == "register_runner":
        import toy_runner

        runners.register_runner(toy_runner.RUNNER)  # the one line
        yield toy_runner
        runners.unregister_runner("toy")
    else:
        monkeypatch.setitem(runners.BUILT_IN, "toy", "toy_runner:RUNNER")  # the one line
        import toy_runner

        yield toy_runner
        runners._registered.pop("toy", None)
    sys.modules.pop("toy_runner", None)


def test_a_toy_runner_is_in_help_parsing_checks_dry_run_and_run(toy, script, capsys,
                                                                 monkeypatch):
    help_text = cli.build_parser().format_help()
    assert "toy (a cluster of pods)" in help_text and "--toy-pods-per-node" in help_text

    launch = cli.parse_args(["--toy-context", "c1", "--toy-pods-per-node", "2", "--workers", "3",
                             script])
    assert launch.runner is not None and launch.runner.name == "toy"
    assert launch.runner_options == {"context": "c1", "per_node": 2}
    assert cli.parse_args(["--workers", "3", script]).runner.name == "local"

    assert cli.main(["--dry-run", "--toy-context", "c1", "--toy-pods-per-node", "2",
                     "--workers", "3", script]) == 0
    pods = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(p["pod"], p["node"], p["context"]) for p in pods] == [
        ("worker-0", 0, "c1"), ("worker-1", 0, "c1"), ("worker-2", 1, "c1")]
    assert pods[0]["command"][-1] == script

    assert cli.main(["--toy-context", "c2", "--workers", "2", script]) == 7
    (plan, options), = toy.RUNS
    assert isinstance(plan, JobPlan) and plan.roles["worker"] == 2
    assert options == {"context": "c2", "per_node": 1}

    monkeypatch.setenv("TFDIST_LAUNCH_TOY_CONTEXT", "from-env")
    assert "TOY_CONTEXT" in arguments.environment_defaults()
    assert cli.parse_args(["--workers", "2", script]).runner_options["context"] == "from-env"


@pytest.mark.parametrize(("argv", "message"), [
    (["--toy-pods-per-node", "2", "{script}"], "--toy-pods-per-node only applies with "
     "--toy-context"),
    (["--toy-context", "c", "--toy-pods-per-node", "0", "{script}"],
     "--toy-pods-per-node must be 1 or more. Received: 0"),
    (["--toy-context", "c", "--ray", "--", "{script}"], "runners ray and toy were both asked for"),
])
def test_the_toy_runners_checks_stop_the_command_line(toy, script, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_args([arg.format(script=script) for arg in argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_without_the_line_the_toy_runner_is_unknown(tmp_path, script, capsys):
    """The sabotage check of the fixture: the toy module alone, registered nowhere, adds
    nothing."""
    (tmp_path / "toy_unregistered.py").write_text(TOY_FILE)
    assert "toy" not in [runner.name for runner in runners.registered_runners()]
    assert "--toy-context" not in cli.build_parser().format_help()
    with pytest.raises(SystemExit):
        cli.parse_args(["--toy-context", "c1", script])
    assert "unrecognized arguments: --toy-context" in capsys.readouterr().err


def test_every_built_in_runner_is_one_folder_whose_init_holds_its_record():
    root = Path(runners.__file__).parent
    for name, target in runners.BUILT_IN.items():
        module, _, attribute = target.partition(":")
        assert (module, attribute) == (f"tfdist.launcher.{name}", "RUNNER"), name
        assert (root / name / "__init__.py").is_file(), name
        assert runners.runner_named(name).name == name


def test_the_built_in_runners_are_chosen_by_their_own_flags(script):
    cases = {"local": [], "hosts": ["--hosts", "localhost:2"], "ray": ["--ray", "local"],
             "export": ["--export", "slurm"]}
    for name, flags in cases.items():
        launch = cli.parse_args([*flags, "--workers", "2", script])
        assert launch.runner is not None and launch.runner.name == name, name


def test_a_runner_name_is_checked_and_taken_once():
    with pytest.raises(ValueError, match="lower-case identifier. Received: 'Kube'"):
        Runner("Kube", describe=lambda plan, options: [], run=lambda plan, options: 0)
    with pytest.raises(ValueError, match="registered already. Received: 'ray'"):
        runners.register_runner(dataclasses.replace(runners.runner_named("ray")))
    with pytest.raises(ValueError, match="Unknown runner. Received: 'kube'"):
        runners.runner_named("kube")


def test_the_registry_is_what_the_cli_reads(script, monkeypatch):
    """Sabotage: a registry whose runners are never chosen sends ``--export`` to the local
    runner, so the CLI holds no choice of its own."""
    never = tuple(dataclasses.replace(runner, chosen=lambda args: False)
                  for runner in runners.registered_runners())
    monkeypatch.setattr(runners, "registered_runners", lambda: never)
    launch = cli.parse_args(["--export", "slurm", "--workers", "2", script])
    assert launch.runner is not None and launch.runner.name == "local"


def test_every_runners_dry_run_loads_no_tensorflow_keras_horovod_or_ray(script):
    """The launcher imports a few TensorFlow-free modules of the layers above it (the pipeline's
    config and layout, the start-up deadline, Horovod's checks and rendezvous), never a
    framework: each built-in runner's dry run, in a fresh process."""
    code = (
        "import contextlib, io, sys\n"
        "from tfdist.launcher import cli\n"
        f"script = {script!r}\n"
        "runs = [['--strategy', 'pipeline', '--stages', '2', '--workers', '4'],\n"
        "        ['--hosts', 'localhost:2', '--workers', '2'], ['--ray', 'local'],\n"
        "        ['--export', 'kubeflow', '--ps', '1'], ['--strategy', 'horovod']]\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    codes = [cli.main(['--dry-run', *argv, script]) for argv in runs]\n"
        "print(codes, len(out.getvalue().splitlines()))\n"
        "print(sorted(m for m in ('tensorflow', 'keras', 'tf_keras', 'horovod', 'ray')\n"
        "             if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.splitlines()
    codes, lines = out[0].rsplit(" ", 1)
    assert codes == "[0, 0, 0, 0, 0]" and int(lines) > 10
    assert out[1] == "[]"
