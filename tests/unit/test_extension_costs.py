"""What adding a schedule, a runner and a strategy costs, counted: one file and one line each.

`TOY_MODULE` is the one new file: a pipeline schedule class, a runner record and a strategy
class. `REGISTRY_LINES` are the one line each adds. With nothing else edited, every reader picks
all three up: the launcher's ``--help`` and choices, its parsing, the plan and the dry run, the
simulator, the engine's actions and the advisor's bubble. The table "What adding one costs" of
``docs/architecture.md`` states the same counts and names the tests that keep them; a test here
reads it, so the doc and the code cannot drift apart.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfdist.advise import model as cost_model
from tfdist.core import registry
from tfdist.launcher import arguments, cli, runners
from tfdist.pipeline import schedule

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

TOY_MODULE = '''
"""One new file: a schedule, a runner and a strategy."""
import json
from tfdist.launcher.runners import Runner
from tfdist.pipeline.schedule import Action, PipelineSchedule
from tfdist.strategies.multi_worker import MultiWorkerMirroredStrategy


class OneAtATime(PipelineSchedule):
    """Each micro-batch's forward and backward before the next one's forward."""
    name = "one-at-a-time"
    summary = "no overlap (a toy)"

    def actions(self, stage):
        self._rank(stage)
        return tuple(Action(op, m) for m in range(self.micro_batches) for op in "FB")


def describe(plan, options):
    return [json.dumps({"pod": f"{task.type}-{task.index}", "strategy": plan.strategy,
                        "env": dict(plan.env)}) for task in plan.tasks()]


RUNNER = Runner("pods", describe=describe, run=lambda plan, options: 0,
                add_arguments=lambda parser: parser.add_argument_group("pods (a toy)")
                .add_argument("--pods", action="store_true", help="run as pods"),
                chosen=lambda args: args.pods)


class ToyStrategy(MultiWorkerMirroredStrategy):
    """A strategy of your own: a subclass keeping its parent's traits."""
    name = "toy"
'''

REGISTRY_LINES = (
    "schedule.register_schedule(toy_extensions.OneAtATime)",
    "runners.register_runner(toy_extensions.RUNNER)",
    "registry.register('toy', toy_extensions.ToyStrategy)",
)
"""The one line each of the three adds (run by the fixture)."""


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """`TOY_MODULE` written as one file and registered by `REGISTRY_LINES`; undone after."""
    (tmp_path / "toy_extensions.py").write_text(TOY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("toy_extensions", None)
    import toy_extensions

    for line in REGISTRY_LINES:
        exec(line, {"schedule": schedule, "runners": runners, "registry": registry,  # noqa: S102
                    "toy_extensions": toy_extensions})
    yield toy_extensions
    schedule.SCHEDULES.pop("one-at-a-time", None)
    runners.unregister_runner("pods")
    registry.unregister("toy")
    sys.modules.pop("toy_extensions", None)


def test_the_toy_module_is_one_file_and_each_addition_one_line(toy, tmp_path):
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".py"] == ["toy_extensions.py"]
    assert len(REGISTRY_LINES) == 3 and all("\n" not in line for line in REGISTRY_LINES)


def test_the_launcher_offers_all_three(toy):
    parser = arguments.build_parser()
    text = " ".join(parser.format_help().split())
    assert "pods (a toy)" in text and "no overlap (a toy)" in text
    args = parser.parse_args(["--pods", "--strategy", "toy", "--workers", "2", "t.py"])
    assert args.strategy == "toy" and args.pods
    assert parser.parse_args(["--schedule", "one-at-a-time", "t.py"]).schedule == "one-at-a-time"
    assert "toy" in registry.available_strategies()
    assert registry.get_strategy_class("toy") is toy.ToyStrategy
    assert registry.strategy_traits("toy") is toy.ToyStrategy.traits


def test_the_toy_runner_dry_runs_the_toy_strategy(toy, tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    status = cli.main(["--pods", "--strategy", "toy", "--workers", "2", "--dry-run",
                       str(script)])
    pods = [json.loads(line) for line in capsys.readouterr().out.splitlines()
            if line.startswith("{")]
    assert status == 0
    assert [pod["pod"] for pod in pods] == ["worker-0", "worker-1"]
    assert {pod["strategy"] for pod in pods} == {"toy"}
    assert {pod["env"]["TFDIST_STRATEGY"] for pod in pods} == {"toy"}


def test_the_toy_schedule_reaches_the_plan_the_engine_the_simulator_and_the_advisor(
        toy, tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    assert cli.main(["--strategy", "pipeline", "--workers", "2", "--stages", "2",
                     "--schedule", "one-at-a-time", "--dry-run", str(script)]) == 0
    tasks = [json.loads(line) for line in capsys.readouterr().out.splitlines()
             if line.startswith("{")]
    assert [t["env"]["TFDIST_PIPELINE_SCHEDULE"] for t in tasks] == ["one-at-a-time"] * 2
    plan = schedule.schedule_class("one-at-a-time")(2, 4)
    assert [a.op for a in plan.actions(1)] == ["F", "B"] * 4
    # on paper: the two stages one after the other, M (K - 1) idle slots of 3 (F + B = 1 + 2)
    assert plan.step_time() == 2 * 4 * 3.0 and plan.idle_slots() == 4.0
    assert cost_model.bubble(2, 4, "one-at-a-time") == 0.5


def _costs_table() -> dict[str, list[str]]:
    """The rows of "What adding one costs" in docs/architecture.md: first cell -> cells."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## What adding one costs", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| ")]
    return {row[0]: row for row in rows[1:]}


def test_the_documented_costs_are_the_counted_ones_and_name_real_tests():
    table = _costs_table()
    files = {name: re.match(r"(\d+):", row[1]) for name, row in table.items()}
    counts = {name: int(match.group(1)) for name, match in files.items() if match}
    assert counts == {"a runner (a Kubernetes one)": 1, "a strategy of your own": 1,
                      "a built-in strategy": 2, "a pipeline schedule": 1}
    kept_by = {path for row in table.values() for path in re.findall(r"`(tests/[^`]+\.py)", row[3])}
    assert "tests/unit/test_extension_costs.py" in kept_by
    assert [p for p in kept_by if not (ROOT / p).is_file()] == []
