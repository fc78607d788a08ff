"""Preemption: on SIGTERM a job saves at the step it is in, exits 75, and a rerun resumes there.

What happens, end to end:

1. ``tfdist-launch`` receives SIGTERM (Slurm or Kubernetes preempting the job, or you). It
   forwards SIGTERM to every task and gives them ``--preemption-grace`` seconds; whatever still
   runs then is SIGKILLed.
2. In each training task, TensorFlow's ``PreemptionCheckpointHandler`` notes the signal. The
   workers agree (through the coordination service) on the next step, finish it, save one
   checkpoint there together, and exit with `PREEMPTED_EXIT_STATUS` after printing a line that
   starts with `PREEMPTED_MARKER` and says the step and the directory.
3. The launcher exits with `PREEMPTED_EXIT_STATUS` too, naming the checkpoint, when every
   training task saved; otherwise with 143 (128 + SIGTERM), naming the tasks that did not.
4. The same command, run again, restores that checkpoint and goes on from the next step.

Two thin bindings share this module: ``strategy.backup_callback(dir)`` for ``model.fit``
(tf-keras's ``BackupAndRestore`` with its handler switched on off Google Cloud, see
`tfdist.strategies.backup`) and ``strategy.preemption_handler(checkpoint, dir)`` for custom
loops. Which strategies support it is their ``preemption_saves`` attribute. The pipeline has its
own bindings with the same names, whose stages agree on the step by a vote after each step
(`tfdist.pipeline.preemption`).

This module imports TensorFlow only inside the functions that need it, so the launcher can read
the constants.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = [
    "PREEMPTED_EXIT_STATUS",
    "PREEMPTED_MARKER",
    "exit_preempted",
    "marker_line",
    "preemption_handler",
    "skip_at_start",
    "termination_config",
]

PREEMPTED_EXIT_STATUS = 75
"""Exit status of a task, and of ``tfdist-launch``, that saved a checkpoint on SIGTERM and
stopped. 75 is ``EX_TEMPFAIL`` (sysexits.h): a temporary failure; run the command again."""

PREEMPTED_MARKER = "tfdist-preempted:"
"""Start of the line a task prints once its preemption checkpoint is saved."""


def marker_line(where: str) -> str:
    """The line a task prints after saving on SIGTERM.

    Example:
        >>> marker_line("epoch 2, step 3 (global step 15) in /runs/backup")
        'tfdist-preempted: saved a checkpoint at epoch 2, step 3 (global step 15) in /runs/backup'
    """
    return f"{PREEMPTED_MARKER} saved a checkpoint at {where}"


def exit_preempted(describe: Callable[[], str]) -> None:
    """Prints `marker_line` (``describe()`` says where the checkpoint is) and exits 75 at once."""
    print(marker_line(describe()), flush=True)
    sys.stderr.flush()
    # The checkpoint is written (saves are synchronous) and a rerun is a new process, so skip
    # the interpreter's and TF's teardown: under MultiWorkerMirrored it took 8.5 s of the grace
    # after the save (2 workers, 2 cores), waiting on a coordination service that was leaving.
    os._exit(PREEMPTED_EXIT_STATUS)


def termination_config(describe: Callable[[], str]) -> Any:
    """TF's ``TerminationConfig`` for tfdist jobs: SIGTERM triggers the save, then exit 75.

    Args:
        describe: Called after the checkpoint is saved; returns where it is (step, directory),
            for the line the task prints.

    Example:
        >>> config = termination_config(lambda: "step 3 in /tmp/ckpt")
        >>> config.termination_watcher_fn is None, config.grace_period
        (True, 0)
    """
    import tensorflow as tf

    # No watcher function: TF then installs a SIGTERM handler. Grace period 0: save at the
    # next step and leave, instead of training on through a platform's longer notice.
    return tf.distribute.experimental.TerminationConfig(
        exit_fn=lambda: exit_preempted(describe), grace_period=0
    )


def skip_at_start(dataset: Any, skip: Any) -> Any:
    """``dataset`` whose first iterator skips ``skip`` elements (then ``skip`` is reset to 0).

    ``fit`` restarts its input at the first batch, which is right after an epoch but not after
    a step in the middle of one. ``skip`` is read when the iterator starts, after the backup
    callback has restored the step and set it. Only an endless dataset (``.repeat()``, one
    iterator for the whole ``fit``) is wrapped: there the stream position is the global step.

    Example:
        >>> import tensorflow as tf
        >>> skip = tf.Variable(3, dtype=tf.int64)
        >>> stream = iter(skip_at_start(tf.data.Dataset.range(4).repeat(), skip))
        >>> [int(next(stream)) for _ in range(3)], int(skip.numpy())
        ([3, 0, 1], 0)
    """
    import tensorflow as tf

    if int(dataset.cardinality()) != int(tf.data.INFINITE_CARDINALITY):
        return dataset

    def skipped(_: Any) -> Any:
        count = skip.read_value()
        with tf.control_dependencies([count]):
            reset = skip.assign(0)
        with tf.control_dependencies([reset]):
            return dataset.skip(tf.identity(count))

    stream = tf.data.Dataset.range(1).flat_map(skipped)
    return stream.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))


def preemption_handler(strategy: Any, checkpoint: Any, directory: str) -> Any:
    """TF's ``PreemptionCheckpointHandler`` for a custom loop under ``strategy`` (see its method).

    Raises:
        StrategyConfigError: ``strategy`` does not save on SIGTERM (``preemption_saves``).
    """
    import tensorflow as tf

    from tfdist.errors import StrategyConfigError, format_error

    if not getattr(strategy, "preemption_saves", False):
        raise StrategyConfigError(
            format_error(
                "This strategy cannot save at the current step on SIGTERM.",
                received=f"strategy {getattr(strategy, 'name', strategy)!r}",
                expected="multi_worker (TF's PreemptionCheckpointHandler), pipeline or tensor",
                fix="use get_strategy('multi_worker'), or save a checkpoint every N steps with "
                "strategy.save_checkpoint and restore it with strategy.restore_checkpoint",
            )
        )
    made: list[Any] = []

    def after_save() -> str:
        return f"step {int(made[0]._checkpointed_runs.numpy())}, in {directory}"

    handler = tf.distribute.experimental.PreemptionCheckpointHandler(
        strategy.cluster_resolver, checkpoint, directory,
        termination_config=termination_config(after_save),
    )
    made.append(handler)
    # MultiWorkerMirrored runs one step per handler.run call, so the restored count of calls is
    # the step the input stream must resume at.
    strategy._resume_input_at(int(handler._checkpointed_runs.numpy()))
    return handler
