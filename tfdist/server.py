"""``python -m tfdist.server``: the process of a ParameterServer ``worker`` or ``ps`` task.

It reads and checks TF_CONFIG (strategy ``parameter_server``), starts a
`tf.distribute.Server` for its task, logs one line, and serves until it is stopped: SIGTERM or
SIGINT end it with exit status 0 (the launcher stops these tasks when the chief is done). A
server that dies on its own exits with status 1. Chief and evaluator tasks are refused: they run
the training script.

Example:
    Check a TF_CONFIG without starting anything::

        TF_CONFIG='{"cluster": {"chief": ["h:1"], "worker": ["h:2"], "ps": ["h:3"]},
                    "task": {"type": "ps", "index": 0}}' python -m tfdist.server --dry-run
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from tfdist.cluster import ClusterSpec, Task, read_tf_config
from tfdist.errors import StrategyConfigError, TfdistError, format_error

__all__ = ["serve", "check_server_task", "main", "parse_args"]

logger = logging.getLogger("tfdist")

SERVER_ROLES = ("worker", "ps")


def check_server_task(
    tf_config: str | Mapping[str, Any] | None = None,
) -> tuple[ClusterSpec, Task]:
    """Reads TF_CONFIG (None: the environment) and checks that its task is a worker or ps.

    Example:
        >>> config = {"cluster": {"chief": ["h:1"], "ps": ["h:2"]},
        ...           "task": {"type": "ps", "index": 0}}
        >>> str(check_server_task(config)[1])
        'ps:0'
    """
    cluster, task = read_tf_config(tf_config, strategy="parameter_server")
    if task.type not in SERVER_ROLES:
        raise StrategyConfigError(
            format_error(f"tfdist.server serves worker and ps tasks, not {task.type!r}.",
                         received=f"task {task}", expected="a task of role worker or ps",
                         fix=f"run the training script on {task} instead (the chief creates "
                         "ParameterServerStrategy; the evaluator uses the default strategy)"))
    return cluster, task


def serve(tf_config: str | Mapping[str, Any] | None = None) -> int:
    """Starts this task's server and blocks until SIGTERM/SIGINT; returns the exit status.

    Returns:
        0 when stopped by a signal, 1 when the server ended by itself.
    """
    cluster, task = check_server_task(tf_config)
    import tensorflow as tf

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster.as_dict()),
        job_name=task.type,
        task_index=task.index,
        protocol="grpc",
        start=True,
    )
    logger.info("tfdist.server: %s serving at %s (%s)", task, cluster.address(task), server.target)
    joiner = threading.Thread(target=server.join, name="tfdist-server-join", daemon=True)
    joiner.start()
    while not stop.wait(0.2):
        if not joiner.is_alive():
            logger.error("tfdist.server: the server of %s stopped by itself", task)
            return 1
    logger.info("tfdist.server: %s stopping", task)
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parses ``python -m tfdist.server`` arguments (``argv`` without the program name).

    Example:
        >>> parse_args(["--dry-run"]).dry_run
        True
    """
    parser = argparse.ArgumentParser(
        prog="python -m tfdist.server",
        description="Serve a ParameterServer worker or ps task until SIGTERM.",
    )
    group = parser.add_argument_group("cluster")
    group.add_argument("--tf-config", default=None,
                       help="TF_CONFIG JSON (default: the TF_CONFIG environment variable)")
    parser.add_argument("--dry-run", action="store_true",
                        help="check TF_CONFIG, print the task that would be served, and exit")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for a configuration error)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    args = parse_args(argv)
    try:
        if args.dry_run:
            cluster, task = check_server_task(args.tf_config)
            print(f"would serve {task} at {cluster.address(task)} of {cluster.as_dict()}")
            return 0
        return serve(args.tf_config)
    except TfdistError as err:
        print(f"tfdist.server: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover - exercised by the multi-process tests
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # TF's server threads can block a normal interpreter exit.
