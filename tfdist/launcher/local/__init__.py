"""The local runner: a job's processes on this machine (`tasks.LocalTasks`), in a private
network namespace where allowed (`netns`). ``--hosts`` runs through it too (its remote tasks are
local ``ssh`` processes, `tfdist.launcher.hosts`).

`RUNNER` is its record in `tfdist.launcher.runners`: no flags of its own (it runs what no other
runner claims), ``--dry-run`` prints each task of the placement as one JSON object.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from tfdist.launcher.runners import Runner

if TYPE_CHECKING:
    from tfdist.launcher.placement import Placement
    from tfdist.launcher.plan import JobPlan

__all__ = ["RUNNER", "describe_placement", "run_placed"]


def _placed(plan: JobPlan) -> Placement:
    """The plan placed here or on its hosts (ports held); its warnings printed."""
    from tfdist.launcher.placement import place

    placement = place(plan)
    for warning in placement.warnings:
        print(f"tfdist-launch: warning: {warning}", file=sys.stderr)
    return placement


def describe_placement(plan: JobPlan, options: Any = None) -> list[str]:
    """``--dry-run``: each task of the plan's placement (ports released again), as JSON."""
    placement = _placed(plan)
    placement.release()
    return [json.dumps(line) for line in placement.describe()]


def run_placed(plan: JobPlan, options: Any = None) -> int:
    """Places the plan and runs it under the supervisor (`tasks.run_job`); its exit status."""
    from tfdist.launcher.local.tasks import run_job

    return run_job(plan, _placed(plan))


RUNNER = Runner("local", describe=describe_placement, run=run_placed,
                task_group="tfdist.launcher.local.tasks:LocalTasks")
