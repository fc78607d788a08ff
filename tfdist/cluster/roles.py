"""Role names of a TensorFlow cluster and the `Task` that names one process in it.

Words used throughout `tfdist.cluster`:

* **chief**: the one worker that also saves checkpoints and summaries (the *coordinator* of a
  ParameterServer job). At most one.
* **worker**: a process that computes gradients.
* **ps**: a parameter server; holds variables of a ParameterServer job.
* **evaluator**: a side process that evaluates checkpoints. At most one, and never part of the
  cluster the others train on (TensorFlow hangs when it is, tensorflow#46169).
* **task**: one process, named by its role and its index within that role (``worker:1``).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from tfdist.cluster._error import config_error, show

__all__ = [
    "CHIEF",
    "WORKER",
    "PS",
    "EVALUATOR",
    "ROLES",
    "TRAINING_ROLES",
    "Task",
    "check_role",
]

CHIEF = "chief"
WORKER = "worker"
PS = "ps"
EVALUATOR = "evaluator"

ROLES: tuple[str, ...] = (CHIEF, WORKER, PS, EVALUATOR)
"""Every role, in canonical order (the order of `ClusterSpec.tasks`)."""

TRAINING_ROLES: tuple[str, ...] = (CHIEF, WORKER, PS)
"""The roles of the cluster that a job trains on (everything but the evaluator)."""

_ALIASES = {
    "master": (CHIEF, "'master' is TensorFlow 1's name for the chief"),
    "parameter_server": (PS, "the parameter-server role is spelled 'ps'"),
    "workers": (WORKER, "role names are singular"),
    "chiefs": (CHIEF, "role names are singular"),
    "evaluators": (EVALUATOR, "role names are singular"),
}


def check_role(name: object, field: str, where: str = "cluster spec") -> str:
    """Returns ``name`` if it is one of `ROLES`, else raises a `ClusterConfigError`.

    The error suggests the right spelling: ``"Worker"`` -> ``"worker"``, ``"master"`` ->
    ``"chief"``.

    Args:
        name: The role name to check.
        field: Where it was found, for the message (e.g. ``"task.type"``).
        where: What was being read (e.g. ``"TF_CONFIG"``).

    Example:
        >>> check_role("ps", "task.type")
        'ps'
    """
    if isinstance(name, str) and name in ROLES:
        return name
    expected = f"one of {', '.join(ROLES)} (lower case)"
    problem = f"{field} {show(name)} is not a known role."
    if not isinstance(name, str):
        fix = 'Use a role name string such as "worker".'
    elif name.lower() in ROLES:
        fix = f'Use "{name.lower()}".'
    elif name.lower() in _ALIASES:
        role, why = _ALIASES[name.lower()]
        problem = f"{field} {show(name)} is not a known role ({why})."
        fix = f'Use "{role}".'
    else:
        close = difflib.get_close_matches(name.lower(), ROLES, n=1)
        fix = f'Use "{close[0]}".' if close else "Use one of the expected role names."
    raise config_error(where, problem, received=show(name), expected=expected, fix=fix)


@dataclass(frozen=True, order=True)
class Task:
    """One process of a cluster: its role and its index within that role.

    Tasks sort by ``(type, index)`` as a string and a number; `ClusterSpec.tasks` gives the
    canonical order (chief, workers, ps, evaluator).

    Attributes:
        type: The role, one of `ROLES`.
        index: Position within the role, from 0.

    Example:
        >>> task = Task.parse("worker:1")
        >>> task, str(task)
        (Task(type='worker', index=1), 'worker:1')
    """

    type: str
    index: int

    def __post_init__(self) -> None:
        check_role(self.type, "Task.type", "task")
        if isinstance(self.index, bool) or not isinstance(self.index, int) or self.index < 0:
            raise config_error(
                "task",
                "Task.index must be an integer >= 0.",
                received=show(self.index),
                expected="an int such as 0 or 1",
                fix="Pass the task's position within its role, counting from 0.",
            )

    def __str__(self) -> str:
        return f"{self.type}:{self.index}"

    @classmethod
    def parse(cls, text: str) -> Task:
        """Parses ``"type:index"``; a bare role (``"chief"``) means index 0.

        Example:
            >>> Task.parse("ps:0") == Task("ps", 0), Task.parse("chief")
            (True, Task(type='chief', index=0))
        """
        role, sep, index = str(text).strip().partition(":")
        if not sep:
            return cls(role, 0)
        if not (index.isascii() and index.isdigit()):
            raise config_error(
                "task",
                "the index after ':' is not a whole number.",
                received=show(text),
                expected='"type:index" such as "worker:1"',
                fix=f'Write "{role}:0" (or another index).',
            )
        return cls(role, int(index))
