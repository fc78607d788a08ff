"""SIGTERM in a pipeline job: every process stops at the same step, saves its stage, exits 75.

A stage that stopped alone would leave its neighbours waiting on a transfer, so no process acts
on its own SIGTERM. It notes it (`SigtermVote`), and at the end of every step every process of
the job (all stages of all replicas) adds its note to one sum over the job
(`SigtermVote.agreed`, a collective with a deadline, on the same runtime as the pipeline's
transfers). Every process gets the same sum after the same step: when it is not 0, all save
their own stage (`StepCheckpoint`, one directory per rank) and exit with
`tfdist.preemption.PREEMPTED_EXIT_STATUS`. The rerun restores
each rank's checkpoint and the count of steps it holds, and goes on from the next step.

Two bindings: the ``fit`` callback (`tfdist.strategies.pipeline_backup`) and, for a custom loop
over ``strategy.train_step``, `PipelinePreemptionHandler`.

Example:
    >>> from tfdist.parallel.mesh import world_group
    >>> SigtermVote(world_group(1, 0), timeout=5).agreed()  # one process, no SIGTERM
    False
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfdist.parallel.keys import STOP_VOTE
from tfdist.parallel.mesh import ProcessGroup, world_group
from tfdist.parallel.ops import all_reduce
from tfdist.preemption import exit_preempted
from tfdist.watchdog import StepWatchdog

__all__ = ["SigtermVote", "StepCheckpoint", "PipelinePreemptionHandler", "VOTE_TIMEOUT",
           "vote_timeout", "stop_here", "job_world"]

VOTE_TIMEOUT = 300.0
"""Seconds the step-end vote waits for the other processes when the pipeline has no transfer
timeout: they finish the same step within a transfer of each other, so only a dead or stuck
peer makes it wait that long (the vote then fails, and so does the job)."""


def job_world(strategy: Any) -> ProcessGroup:
    """Every process of ``strategy``'s job (the group it joined; one process: itself alone):
    the pipeline's and the tensor strategy's.

    Example:
        >>> job_world(object()).members
        (0,)
    """
    world = getattr(strategy, "_tfdist_world", None)
    return world if world is not None else world_group(1, 0)


def vote_timeout(strategy: Any) -> float:
    """The vote's deadline: the pipeline's transfer timeout, else `VOTE_TIMEOUT`."""
    return float(getattr(strategy, "timeout", 0.0) or VOTE_TIMEOUT)


class SigtermVote:
    """Notes SIGTERM in this process; `agreed` tells, after a step, whether any process did.

    Args:
        world: Every process of the job (`PipelineLayout.world`).
        timeout: Seconds the vote waits for the others.
    """

    def __init__(self, world: ProcessGroup, timeout: float) -> None:
        self._noted = False
        self._previous: Any = None
        self._world = world
        # One tf.function: every call reuses the instance key, as each training step does. No
        # per-op timeout: TensorFlow's timer of an op is a thread sleeping for the whole timeout,
        # one more per step (320 steps: 198 -> 758 threads); one watchdog holds the deadline.
        self._sum = tf.function(lambda flag: all_reduce(
            flag, world, "sum", instance=STOP_VOTE))
        self._deadline = StepWatchdog(
            timeout, f"pipeline stop vote of {world.size} processes",
            fix="raise the pipeline's timeout_seconds if a step is that slow.")

    def start(self) -> None:
        """From now on SIGTERM is noted, not fatal (Python runs the handler between steps)."""
        self._previous = signal.signal(signal.SIGTERM, self._note)

    def stop(self) -> None:
        """SIGTERM does what it did before `start` again."""
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _note(self, signum: int, frame: Any) -> None:
        self._noted = True

    def agreed(self) -> bool:
        """Whether any process of the job has noted SIGTERM (a collective: every process calls
        it after the same step)."""
        flag = tf.constant(1.0 if self._noted else 0.0)
        if self._world.size < 2:
            return bool(flag)
        self._deadline.arm()
        try:
            return float(self._sum(flag)) > 0
        finally:
            self._deadline.disarm()


class StepCheckpoint:
    """One rank's checkpoint of ``objects`` and of the number of steps it holds.

    Args:
        directory: This rank's directory (the latest checkpoint only is kept).
        **objects: What to save (``model=``, ``optimizer=``, or a whole ``tf.train.Checkpoint``).

    Example:
        >>> import tempfile
        >>> weight = tf.Variable(1.0)
        >>> saver = StepCheckpoint(tempfile.mkdtemp(), weight=weight)
        >>> saver.save(3); _ = weight.assign(5.0)
        >>> saver.restore(), float(weight.numpy())
        (3, 1.0)
    """

    def __init__(self, directory: str, **objects: Any) -> None:
        self.directory = directory
        self._steps = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._checkpoint = tf.train.Checkpoint(tfdist_steps=self._steps, **objects)
        self._manager = tf.train.CheckpointManager(self._checkpoint, directory, max_to_keep=1)

    def restore(self) -> int:
        """Restores the latest checkpoint, if any; the steps it holds (0: none)."""
        latest = self._manager.latest_checkpoint
        if latest:
            self._checkpoint.restore(latest)
        return int(self._steps.numpy())

    def save(self, steps: int) -> None:
        """Saves the objects as they are after ``steps`` steps."""
        self._steps.assign(steps)
        self._manager.save(checkpoint_number=steps)


def stop_here(vote: SigtermVote, saver: StepCheckpoint, steps: int) -> None:
    """After step ``steps``: if the job agreed to stop, saves and exits 75 (else returns)."""
    if vote.agreed():
        saver.save(steps)
        exit_preempted(lambda: f"step {steps}, in {saver.directory}")


class PipelinePreemptionHandler:
    """For a custom loop over ``strategy.train_step``: ``handler.run(step, x, y)`` per step.

    Creating it restores ``checkpoint`` from this rank's directory (``<directory>/rank-<r>``)
    and `total_run_calls`, the steps it holds. Each `run` runs one step, then the job votes; on
    an agreed SIGTERM every rank saves and exits 75. `stop` (or the end of the process)
    gives SIGTERM its previous handling back.

    Args:
        strategy: The `PipelineStrategy` (or `TensorStrategy`).
        checkpoint: A ``tf.train.Checkpoint`` of this stage's model and optimizer.
        directory: The job's directory (the same on every process).
    """

    def __init__(self, strategy: Any, checkpoint: Any, directory: str) -> None:
        self._saver = StepCheckpoint(
            os.path.join(directory, f"rank-{strategy.worker_index}"), checkpoint=checkpoint)
        self.total_run_calls = self._saver.restore()
        self._vote = SigtermVote(job_world(strategy), vote_timeout(strategy))
        self._vote.start()

    def run(self, step: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``step(*args, **kwargs)``, then the stop vote (see the class docstring)."""
        result = step(*args, **kwargs)
        self.total_run_calls += 1
        stop_here(self._vote, self._saver, self.total_run_calls)
        return result

    def stop(self) -> None:
        """SIGTERM ends the process again."""
        self._vote.stop()
