"""Scripts the benchmark runner starts, one process per task (``python -m`` or by path).

Each one measures inside its own process and hands its numbers back with `tfdist.testing.report`.
Settings arrive as command-line flags and a few environment variables (see
`tfdist.probe.common`). The all-reduce worker lives in `tfdist.probe`, which the advisor shares.
"""

from pathlib import Path

WORKERS = Path(__file__).resolve().parent
"""This folder: `tfdist.probe.jobs.run_tf` runs ``WORKERS / "<name>_worker.py"``."""
