"""Scripts the benchmark runner starts, one process per task (``python -m`` or by path).

Each one measures inside its own process and hands its numbers back with `tfdist.testing.report`.
Settings arrive as command-line flags and a few environment variables (see `common`).
"""
