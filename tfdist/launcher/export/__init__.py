"""``--export kubeflow|mpijob|slurm``: the job written for a scheduler instead of run here.

* `documents`: the TFJob, the MPIJob and the sbatch script, from one `JobPlan`.

`RUNNER` is its record in `tfdist.launcher.runners`, an exporter: the ``export`` argument group,
its checks, ``--dry-run`` prints the document, a run prints it or writes ``--output``. What runs
inside a Slurm allocation is `tfdist.launcher.slurm`.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_export_arguments(parser)
    >>> export_options(parser.parse_args(["--export", "slurm", "--nodes", "2"])).nodes
    2
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import TYPE_CHECKING

from tfdist.launcher.options import EXPORT_FORMATS, ExportOptions
from tfdist.launcher.runners import Runner

if TYPE_CHECKING:
    from tfdist.launcher.plan import JobPlan

__all__ = ["EXPORT_ONLY", "RUNNER", "add_export_arguments", "export_options", "export_problem"]

EXPORT_ONLY = ("image", "output", "name", "nodes", "slots_per_worker")
"""Options that only mean something with ``--export`` (their defaults: `ExportOptions`)."""


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``export`` argument group (``--export FORMAT`` and the document's settings)."""
    group = parser.add_argument_group("export (write a scheduler job instead of running)")
    group.add_argument("--export", choices=EXPORT_FORMATS,
                       help="print (or --output) a Kubeflow TFJob, an MPIJob, or a Slurm script")
    group.add_argument("--image", help="container image for kubeflow/mpijob (default "
                       "tfdist:latest)")
    group.add_argument("--output", help="write the export to this file instead of stdout")
    group.add_argument("--name", help="job name (default: the script's name)")
    group.add_argument("--nodes", type=int, help="slurm: nodes (default 1)")
    group.add_argument("--slots-per-worker", type=int,
                       help="mpijob: Horovod ranks per worker pod (default 1)")


def export_options(args: argparse.Namespace) -> ExportOptions | None:
    """``--export`` and its settings, defaults filled (None: no ``--export``)."""
    if not args.export:
        return None
    defaults = ExportOptions(args.export)
    given = {name: getattr(args, name) for name in EXPORT_ONLY if getattr(args, name) is not None}
    return dataclasses.replace(defaults, **given)


def export_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the ``--export`` arguments, or None."""
    given = [name for name in EXPORT_ONLY if getattr(args, name) is not None]
    if given and not args.export:
        flag = "--" + given[0].replace("_", "-")
        return (f"{flag} only applies with --export. Fix: add --export kubeflow|mpijob|slurm, "
                f"or drop {flag}")
    if args.image is not None and not args.image.strip():
        return "--image is empty. Fix: name a container image that holds tfdist and the script"
    if args.output is not None and os.path.isdir(args.output):
        suffix = "sbatch" if args.export == "slurm" else "yaml"
        return (f"--output {args.output!r} is a directory. Fix: name a file, e.g. "
                f"{os.path.join(args.output, 'job.' + suffix)}")
    return None


def describe_export(plan: JobPlan, options: ExportOptions) -> list[str]:
    """``--export --dry-run``: the document, printed even when ``--output`` names a file."""
    from tfdist.launcher.export.documents import export_text

    return export_text(plan, options).splitlines()


def write_export(plan: JobPlan, options: ExportOptions) -> int:
    """Prints the document, or writes it to ``--output`` (`documents.run_export`)."""
    from tfdist.launcher.export.documents import run_export

    return run_export(plan)


RUNNER = Runner(
    "export", describe=describe_export, run=write_export,
    chosen=lambda args: bool(args.export), add_arguments=add_export_arguments,
    options=export_options, problem=export_problem)
