"""Reading a job's tasks from an Alibaba PAI trace ``pai_task_table.csv``.

The trace (alibaba/clusterdata, cluster-trace-gpu-v2020) has one row per task group of a job:
``job_name, task_name, inst_num, status, start_time, end_time, plan_cpu, plan_mem, plan_gpu,
gpu_type``, without a header. ``inst_num`` is how many instances (processes) the group runs;
``plan_cpu`` is per instance, in percent of a core (600 = 6 cores); ``plan_gpu`` likewise in
percent of a GPU (50 = half a GPU). Also accepted: the same data with a header row (columns by
name), and header-less 5-column rows ``job_name, task_name, inst_num, plan_cpu, plan_gpu``.

A job lists each task group once: a second row with the same ``job_name`` and ``task_name``
(case-insensitive) is an error, not added to the first. Different task names of one role (say
``tensorflow`` and ``worker``) are different groups, and their instances are added. ``inst_num``,
and the sum per role, are at most `tfdist.cluster.counts.MAX_TASKS`.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tfdist.cluster._error import config_error, show
from tfdist.cluster.counts import MAX_TASKS, check_count
from tfdist.cluster.roles import CHIEF, EVALUATOR, PS, ROLES, WORKER

__all__ = ["PaiJob", "TASK_NAME_ROLES", "read_pai_table"]

TASK_NAME_ROLES: dict[str, str] = {
    "xtensorflow": WORKER,
    "tensorflow": WORKER,  # The name most TensorFlow workers have in the v2020 trace.
    "PyTorchWorker": WORKER,
    "xComputeWorker": WORKER,
    "worker": WORKER,
    "ps": PS,
    "chief": CHIEF,
    "evaluator": EVALUATOR,
}
"""PAI task names and the role each maps to (also matched case-insensitively)."""

COLUMNS_5 = ("job_name", "task_name", "inst_num", "plan_cpu", "plan_gpu")
COLUMNS_10 = ("job_name", "task_name", "inst_num", "status", "start_time", "end_time",
              "plan_cpu", "plan_mem", "plan_gpu", "gpu_type")
_REQUIRED = ("job_name", "task_name", "inst_num")
_LOWER_NAMES = {name.lower(): role for name, role in TASK_NAME_ROLES.items()}
Record = tuple[str, dict[str, str]]  # (where the row is, for messages; its columns by name)


@dataclass(frozen=True)
class PaiJob:
    """The tasks a PAI job asked for, per role.

    Attributes:
        job_name: The job.
        instances: Role -> number of tasks (roles the job does not use are absent).
        plan_cpu: Role -> CPU per task in percent of a core (600 = 6 cores); None if missing.
        plan_gpu: Role -> GPU per task in percent of a GPU (50 = half); None if missing.

    Example:
        >>> rows = [["j1", "ps", "1.0", "600", ""], ["j1", "worker", "2", "800", "50"]]
        >>> job = read_pai_table(rows)
        >>> job.instances, job.plan_gpu
        ({'worker': 2, 'ps': 1}, {'worker': 50.0, 'ps': None})
    """

    job_name: str
    instances: dict[str, int] = field(default_factory=dict)
    plan_cpu: dict[str, float | None] = field(default_factory=dict)
    plan_gpu: dict[str, float | None] = field(default_factory=dict)

    def local_kwargs(self) -> dict[str, int | bool]:
        """Returns the task counts as `ClusterSpec.local` keyword arguments.

        Raises:
            ClusterConfigError: if the job has more than one chief or evaluator.

        Example:
            >>> PaiJob("j", {"chief": 1, "worker": 3}).local_kwargs()
            {'workers': 3, 'ps': 0, 'chief': True, 'evaluator': False}
        """
        for role in (CHIEF, EVALUATOR):
            if self.instances.get(role, 0) > 1:
                raise config_error(
                    "PAI task table", f"job {self.job_name!r} has {self.instances[role]} {role} "
                    f"tasks; there can be only one {role}.", received=show(self.instances),
                    expected=f"at most one {role}", fix=f"Count the extra {role}s as workers.",
                )
        return {
            "workers": self.instances.get(WORKER, 0),
            "ps": self.instances.get(PS, 0),
            "chief": CHIEF in self.instances,
            "evaluator": EVALUATOR in self.instances,
        }


def _load_rows(source: str | os.PathLike[str] | Iterable[object]) -> tuple[list[object], str]:
    if not isinstance(source, str | os.PathLike):
        return list(source), "PAI task table"
    where = f"PAI task table {os.fspath(source)!r}"
    try:
        with open(source, newline="", encoding="utf-8") as file:
            return list(csv.reader(file)), where
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise config_error(
            where, f"it cannot be read ({error}).", received=show(os.fspath(source)),
            expected="a readable CSV file", fix="Check the path and its permissions.",
        ) from error


def _header(first: object) -> tuple[str, ...] | None:
    """Returns the column names if ``first`` is a header row (it names a task_name column)."""
    if isinstance(first, Sequence) and not isinstance(first, str):
        names = tuple(str(cell).strip().lower() for cell in first)
        if "task_name" in names:
            return names
    return None


def _columns(row: object, header: tuple[str, ...] | None, where: str, at: str) -> dict[str, str]:
    """Names the cells of one row: by the header if any, else by the row's length (5 or 10)."""
    if isinstance(row, Mapping):
        columns = {str(key).strip().lower(): str(value).strip() for key, value in row.items()}
    else:
        cells = [str(cell).strip() for cell in row]  # type: ignore[attr-defined]
        names = header or {len(COLUMNS_5): COLUMNS_5, len(COLUMNS_10): COLUMNS_10}.get(len(cells))
        if names is None or len(names) != len(cells):
            raise config_error(
                where, f"{at} has {len(cells)} columns.", received=show(cells),
                expected=f"{len(header) if header else '5 or 10'} columns", fix="Fix that row.",
            )
        columns = dict(zip(names, cells, strict=True))
    missing = [name for name in _REQUIRED if name not in columns]
    if missing:
        raise config_error(
            where, f"{at} has no {', '.join(missing)} column.", received=show(row),
            expected=f"columns including {', '.join(_REQUIRED)}", fix="Add those columns.",
        )
    return columns


def _records(rows: list[object], where: str) -> list[Record]:
    """Returns every non-blank row with its columns named."""
    header = _header(rows[0]) if rows else None
    start = 1 if header else 0
    return [
        (f"row {number + 1}", _columns(row, header, where, f"row {number + 1}"))
        for number, row in enumerate(rows[start:], start=start)
        if isinstance(row, Mapping) or any(str(cell).strip() for cell in row)  # type: ignore
    ]


def _select_job(records: list[Record], job_name: str | None, where: str) -> list[Record]:
    names = list(dict.fromkeys(columns["job_name"] for _, columns in records))
    if job_name is None and len(names) == 1:
        job_name = names[0]
    chosen = [record for record in records if record[1]["job_name"] == job_name]
    if not chosen:
        problem = (
            f"job {job_name!r} is not in it." if job_name
            else "it holds several jobs." if names
            else "it holds no task rows."
        )
        listed = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise config_error(
            where, problem, received=f"job_name={job_name!r}; {len(names)} jobs: {listed}",
            expected="the name of one job in the table", fix="Pass job_name= with one of those.",
        )
    return chosen


def _role(task_name: str, where: str, row: str) -> str:
    role = TASK_NAME_ROLES.get(task_name) or _LOWER_NAMES.get(task_name.lower())
    if role is None:
        raise config_error(
            where, f"{row} has an unknown task_name {task_name!r}.", received=show(task_name),
            expected=f"one of {', '.join(TASK_NAME_ROLES)}",
            fix="Keep only rows of TensorFlow-like jobs, or rename the task.",
        )
    return role


def _instances(value: str, where: str, row: str) -> int:
    """Reads ``inst_num`` (``"2"`` or ``"2.0"``): a whole number in 1..MAX_TASKS."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    count: object = int(number) if number.is_integer() else value  # False for nan and inf.
    return check_count(
        count, f"the inst_num of {row}", where, minimum=1, received=show(value),
        fix="Fix that row: inst_num is how many processes the task group runs, such as 2.",
    )


def _check_unique_groups(chosen: list[Record], where: str) -> None:
    """Refuses a second row with the same job_name and task_name (compared case-insensitively)."""
    seen: dict[str, str] = {}
    for row, columns in chosen:
        first = seen.setdefault(columns["task_name"].lower(), row)
        if first != row:
            raise config_error(
                where, f"{row} repeats task group {columns['task_name']!r} of job "
                f"{columns['job_name']!r}, already given in {first}.", received=show(columns),
                expected="each (job_name, task_name) once",
                fix=f"Remove the duplicate row, or merge it into {first} by adding the inst_num.",
            )


def _add_instances(counts: dict[str, int], role: str, number: int, where: str, row: str) -> None:
    """Adds a task group's instances to its role, keeping the role's total at most MAX_TASKS."""
    total = counts.get(role, 0) + number
    if total > MAX_TASKS:
        raise config_error(
            where, f"{row} brings the {role} tasks to {total}, more than {MAX_TASKS} "
            "(tfdist.cluster.MAX_TASKS).", received=show(counts | {role: total}),
            expected=f"at most {MAX_TASKS} tasks per role", fix="Check the inst_num values.",
        )
    counts[role] = total


def _plan(value: str | None) -> float | None:
    try:
        number = float(value or "nan")
    except ValueError:
        return None
    return None if math.isnan(number) or math.isinf(number) else number


def read_pai_table(
    path_or_rows: str | os.PathLike[str] | Iterable[object], job_name: str | None = None
) -> PaiJob:
    """Reads one job's task counts and resource plans from a PAI task table.

    Args:
        path_or_rows: A CSV path, or rows (sequences of cells, or mappings by column name).
        job_name: The job to read; may be omitted when the table holds a single job.

    Raises:
        ClusterConfigError: unreadable file, bad row, unknown job or task name, bad inst_num,
            a task group listed twice, more than `MAX_TASKS` tasks of a role.

    Example:
        >>> read_pai_table([["job_name", "task_name", "inst_num"], ["j", "chief", "1"]]).instances
        {'chief': 1}
    """
    rows, where = _load_rows(path_or_rows)
    counts: dict[str, int] = {}
    cpu: dict[str, float | None] = {}
    gpu: dict[str, float | None] = {}
    chosen = _select_job(_records(rows, where), job_name, where)
    _check_unique_groups(chosen, where)
    for row, columns in chosen:
        role = _role(columns["task_name"], where, row)
        _add_instances(counts, role, _instances(columns["inst_num"], where, row), where, row)
        for plans, key in ((cpu, "plan_cpu"), (gpu, "plan_gpu")):
            values = [v for v in (plans.get(role), _plan(columns.get(key))) if v is not None]
            plans[role] = max(values) if values else None
    order = [role for role in ROLES if role in counts]
    return PaiJob(
        job_name=chosen[0][1]["job_name"],
        instances={role: counts[role] for role in order},
        plan_cpu={role: cpu[role] for role in order},
        plan_gpu={role: gpu[role] for role in order},
    )
