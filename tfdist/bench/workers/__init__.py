"""Scripts the benchmark runner starts, one process per task (``python -m`` or by path).

Each one measures inside its own process and hands its numbers back with `tfdist.testing.report`.
Settings arrive as command-line flags and a few environment variables (see
`tfdist.probe.common`). The all-reduce worker lives in `tfdist.probe`, which the advisor shares.
"""

from pathlib import Path
from typing import NoReturn

from tfdist.testing import exit_after_report

WORKERS = Path(__file__).resolve().parent
"""This folder: `tfdist.probe.jobs.run_tf` runs ``WORKERS / "<name>_worker.py"``."""


def exit_after(mode: str) -> NoReturn:
    """`tfdist.testing.exit_after_report`; a one-process job (``--mode default``) leaves at once:
    no peer reads its part of a collective (0.5 s of each such job's wall time)."""
    if mode == "default":
        exit_after_report(linger=0.0)
    exit_after_report()
