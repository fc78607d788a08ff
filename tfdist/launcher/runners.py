"""The runners of ``tfdist-launch`` as a registry: one `Runner` record each.

A runner takes a planned job (`tfdist.launcher.plan.JobPlan`) somewhere: this machine
(``local``), other machines over ssh (``hosts``), a Ray cluster (``ray``), or a scheduler's file
(``export``). Its record holds all the command line needs of it: its argument group, the
``TFDIST_LAUNCH_*`` defaults those arguments read, whether a command line asks for it, its typed
options, its checks (named before anything starts), what ``--dry-run`` prints, and how it runs
(through its `TaskGroup` under the one `Supervisor` policy, or as an exporter).
`tfdist.launcher.cli` reads this registry only; no code branches on a runner's name.

Adding a runner is one file and one line: the file defines its `Runner` (its folder under
``tfdist/launcher/``, or a module of your own), the line registers it (`register_runner`, or a
``name: "module:RUNNER"`` entry of `BUILT_IN` for one that ships with tfdist).

Example:
    >>> [runner.name for runner in registered_runners()]
    ['local', 'export', 'hosts', 'ray']
    >>> runner_named("ray").environment
    ('RAY',)
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tfdist.errors import format_error

if TYPE_CHECKING:
    from tfdist.launcher.plan import JobPlan

__all__ = ["BUILT_IN", "DEFAULT_RUNNER", "ENV_PREFIX", "Runner", "chosen_runner",
           "environment_default", "register_runner", "registered_runners", "runner_named",
           "runner_problem", "unregister_runner"]

ENV_PREFIX = "TFDIST_LAUNCH_"
DEFAULT_RUNNER = "local"
"""The runner of a command line that asks for no other."""

BUILT_IN: dict[str, str] = {
    "local": "tfdist.launcher.local:RUNNER",
    "export": "tfdist.launcher.export:RUNNER",
    "hosts": "tfdist.launcher.hosts:RUNNER",
    "ray": "tfdist.launcher.ray:RUNNER",
}
"""Runner name -> its record (``module:NAME``, imported when the registry is first read). The
order is the order of their argument groups in ``--help`` and of their checks."""

_registered: dict[str, Runner] = {}
_NAME = re.compile(r"[a-z][a-z0-9_]*")


def _never(args: argparse.Namespace) -> bool:
    return False


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    return None


def _no_options(args: argparse.Namespace) -> None:
    return None


def _no_problem(args: argparse.Namespace) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class Runner:
    """Everything ``tfdist-launch`` needs of one runner.

    Attributes:
        name: Its registry name (lower case, ``_``).
        describe: ``(plan, options) -> lines``: what ``--dry-run`` prints, nothing started.
        run: ``(plan, options) -> exit status``: runs the job (or writes it, for an exporter).
            It may raise `ClusterConfigError`, `StrategyConfigError` or
            `MissingDependencyError` (the CLI exits 2) or `LaunchError` (exits 1).
        chosen: ``args -> bool``: whether a parsed command line asks for it (the default
            runner's: never; it runs what no other runner claims).
        add_arguments: Adds its argument group to the parser (shown in ``--help``).
        environment: The ``TFDIST_LAUNCH_<NAME>`` variables its arguments take defaults from.
        options: ``args -> options``: its typed options, handed to ``describe`` and ``run``.
        problem: ``args -> message or None``: what is wrong with its arguments (checked on every
            command line, chosen or not: its flags given without it are a problem too).
        checked_after_plan: Its ``problem`` is named after the job's own arguments and layout
            (about where the job runs, not what it is); default: before the plan.
        task_group: ``module:Class`` of its `tfdist.launcher.supervisor.TaskGroup`, which
            `supervisor.run_job` drives (None: an exporter).

    Example:
        >>> toy = Runner("toy", describe=lambda plan, options: ["nothing to start"],
        ...              run=lambda plan, options: 0)
        >>> toy.chosen(argparse.Namespace()), toy.problem(argparse.Namespace())
        (False, None)
    """

    name: str
    describe: Callable[[JobPlan, Any], Sequence[str]]
    run: Callable[[JobPlan, Any], int]
    chosen: Callable[[argparse.Namespace], bool] = _never
    add_arguments: Callable[[argparse.ArgumentParser], None] = _no_arguments
    environment: tuple[str, ...] = ()
    options: Callable[[argparse.Namespace], Any] = _no_options
    problem: Callable[[argparse.Namespace], str | None] = _no_problem
    checked_after_plan: bool = False
    task_group: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(format_error(
                "A runner's name must be a lower-case identifier.", received=repr(self.name),
                expected="e.g. 'kubernetes'", fix="rename it"))
        bad = [name for name in self.environment if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name)]
        if bad:
            raise ValueError(format_error(
                f"Runner {self.name!r}: environment names are the part after {ENV_PREFIX}.",
                received=bad[0], expected="upper case, e.g. 'KUBE_CONTEXT'",
                fix=f"name the variable {ENV_PREFIX}<NAME> by its <NAME>"))


def registered_runners() -> tuple[Runner, ...]:
    """Every runner: the built-ins in `BUILT_IN` order, then those registered, in order."""
    for name, target in BUILT_IN.items():
        if name not in _registered:
            module, _, attribute = target.partition(":")
            _registered[name] = getattr(importlib.import_module(module), attribute)
    built_in = [_registered[name] for name in BUILT_IN]
    return (*built_in, *(r for name, r in _registered.items() if name not in BUILT_IN))


def runner_named(name: str) -> Runner:
    """The runner registered as ``name``.

    Example:
        >>> runner_named("local").task_group
        'tfdist.launcher.local.tasks:LocalTasks'
    """
    runners = {runner.name: runner for runner in registered_runners()}
    if name not in runners:
        raise ValueError(format_error(
            "Unknown runner.", received=repr(name), expected=f"one of {sorted(runners)}",
            fix="register it first (tfdist.launcher.runners.register_runner)"))
    return runners[name]


def register_runner(runner: Runner) -> Runner:
    """Adds ``runner`` to the registry (its arguments, checks and dry run join the CLI's).

    Raises:
        ValueError: A runner of that name is registered already.

    Example:
        >>> toy = register_runner(Runner("toy", describe=lambda plan, options: [],
        ...                              run=lambda plan, options: 0))
        >>> [runner.name for runner in registered_runners()][-1]
        'toy'
        >>> unregister_runner("toy")
    """
    if runner.name in BUILT_IN or runner.name in _registered:
        raise ValueError(format_error(
            "A runner of that name is registered already.", received=repr(runner.name),
            expected=f"a name other than {sorted({*BUILT_IN, *_registered})}",
            fix="rename the new runner"))
    _registered[runner.name] = runner
    return runner


def unregister_runner(name: str) -> None:
    """Removes a runner that `register_runner` added (built-ins stay)."""
    if name not in BUILT_IN:
        _registered.pop(name, None)


def chosen_runner(args: argparse.Namespace) -> Runner:
    """The runner a parsed command line asks for: the first registered one whose ``chosen``
    says so, else `DEFAULT_RUNNER`."""
    for runner in registered_runners():
        if runner.chosen(args):
            return runner
    return runner_named(DEFAULT_RUNNER)


def runner_problem(args: argparse.Namespace, *, after_plan: bool) -> str | None:
    """The first problem a runner finds in ``args`` (those checked before or after the plan),
    or, after the plan, two runners asked for at once; None when there is none."""
    runners = [r for r in registered_runners() if r.checked_after_plan == after_plan]
    for runner in runners:
        problem = runner.problem(args)
        if problem:
            return problem
    chosen = [runner.name for runner in registered_runners() if runner.chosen(args)]
    if after_plan and len(chosen) > 1:
        return (f"runners {' and '.join(chosen)} were both asked for: a job runs in one place. "
                f"Fix: drop the options of one of them")
    return None


def environment_default(name: str, default: str | None = None) -> str | None:
    """The default that ``TFDIST_LAUNCH_<name>`` gives an option (``default`` if unset or empty
    and ``default`` is None, else unset)."""
    value = os.environ.get(ENV_PREFIX + name)
    if default is None:
        return value or None
    return default if value is None else value
