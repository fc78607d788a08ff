"""The pipeline's ``fit`` backup: per-rank, saved at the step on SIGTERM, in either Keras.

`step_backup` is what ``strategy.backup_callback(dir)`` gives a pipeline stage (each rank keeps
``<dir>/rank-<r>``, as the stages hold different weights). What it does
(`tfdist.resilience.pipeline_vote` for the vote and the checkpoint):

* ``on_train_begin``: restores this rank's checkpoint of the model and optimizer (under ZeRO
  stage 3, of its pieces instead of the model: `backup_objects`) and ``g``, the
  steps it holds. ``fit`` then starts at epoch ``g // steps``, and the first ``g % steps`` calls
  of that epoch's train function take their batch from the input without running it (the
  weights already hold those steps): the rerun reads the same batches as an uninterrupted run.
* ``on_train_batch_end``: every process votes; on an agreed SIGTERM every rank saves and exits
  75 (`tfdist.resilience.preemption.PREEMPTED_EXIT_STATUS`). ``save_freq=N`` saves every N
  steps too.
* ``on_epoch_end``: saves, so a crash (not a SIGTERM) resumes at the last epoch.
* ``on_train_end``: SIGTERM is fatal again and, unless ``delete_checkpoint=False``, the rank's
  backup is deleted (a finished job starts afresh, as Keras's callback does).

`StepBackupMixin` gives the pipeline and the tensor strategy this callback and the custom
loop's ``preemption_handler``; `PipelineBackupMixin` adds the pipeline's ``backup_layout`` (what
a rank's backup depends on, which `tfdist.resilience.claim` checks before ``fit``).

The input is re-read from its start each epoch (arrays, or a finite dataset). One step per
train-function call: ``steps_per_execution`` must be 1.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from tfdist.core import flavour
from tfdist.errors import StrategyConfigError, format_error

__all__ = ["PipelineBackupMixin", "StepBackupMixin", "backup_objects", "refuse_stage3_models",
           "step_backup"]


def backup_objects(model: Any, optimizer: Any = None) -> dict[str, Any]:
    """What a rank's backup checkpoints: its stage (shard) ``model`` and its optimizer
    (``optimizer``, default the model's; left out where there is none); under ZeRO stage 3
    (`tfdist.zero.data_axis_layers`), whose model's trainable variables hold no values between
    steps, this process's pieces of them (``zero_pieces``) and the model's other variables
    (``zero_state``) instead of the model (the optimizer is built on the pieces: its slots are
    theirs).

    Example:
        >>> keras = flavour.get_keras()
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> sorted(backup_objects(model)), sorted(backup_objects(model, keras.optimizers.Adam()))
        (['model'], ['model', 'optimizer'])
    """
    optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    found: dict[str, Any] = {"model": model}
    zero = _stage3(model)
    if zero is not None:
        found = {"zero_pieces": list(zero.pieces),
                 "zero_state": list(model.non_trainable_variables)}
    return found if optimizer is None else {**found, "optimizer": optimizer}


def _stage3(model: Any) -> Any:
    """``model``'s ZeRO stage 3 (`DataAxisLayers`), or None."""
    from tfdist.zero.data_axis_layers import DataAxisLayers

    zero = getattr(model, "_pipeline_zero", None) or getattr(model, "zero", None)
    return zero if isinstance(zero, DataAxisLayers) else None


def refuse_stage3_models(checkpoint: Any) -> None:
    """Refuses a ``tf.train.Checkpoint`` that holds a model under ZeRO stage 3 directly: its
    trainable variables hold no values between steps, and saving it fails at the first save
    (Keras reads an empty variable as zeros, which has no checkpoint form), long after the
    job started.

    Raises:
        StrategyConfigError: such a model among the checkpoint's objects, named.

    Example:
        >>> import tensorflow as tf
        >>> refuse_stage3_models(tf.train.Checkpoint(step=tf.Variable(0)))
    """
    children = getattr(checkpoint, "_trackable_children", lambda: {})()
    for name, child in children.items():
        if _stage3(child) is not None:
            raise StrategyConfigError(format_error(
                "Under ZeRO stage 3 a stage's (shard's) model holds no values between steps: "
                "a checkpoint of it cannot be saved.",
                received=f"tf.train.Checkpoint({name}=<{type(child).__name__} under zero=3>)",
                expected="this process's pieces of the weights, its optimizer and the model's "
                         "other variables",
                fix=f"tf.train.Checkpoint(step=..., **strategy.backup_objects({name}, "
                    "optimizer)) in place of the model and optimizer"))


def step_backup(strategy: Any, directory: str, save_freq: int | str = "epoch",
                delete_checkpoint: bool = True) -> Any:
    """The callback of the module docstring for this rank (``directory``: its own).

    Raises:
        StrategyConfigError: ``save_freq`` is neither ``"epoch"`` nor a positive int.
    """
    _check_save_freq(save_freq)
    keras = flavour.get_keras()

    class PipelineBackupAndRestore(keras.callbacks.Callback):
        """Per-rank backup that saves at the step on SIGTERM
        (`tfdist.resilience.pipeline_backup`)."""

        def __init__(self) -> None:
            super().__init__()
            self.backup_dir = directory
            self._restored = 0
            self._steps = 0

        def on_train_begin(self, logs: Any = None) -> None:
            from tfdist.resilience.pipeline_vote import (
                SigtermVote,
                StepCheckpoint,
                job_world,
                vote_timeout,
            )

            _check_one_step_per_call(self.model)
            per_epoch = _steps_per_epoch(self.params)
            self._saver = StepCheckpoint(directory, **backup_objects(self.model))
            self._restored = self._saver.restore()
            epoch, skip = divmod(self._restored, per_epoch)
            self._steps = epoch * per_epoch
            self._train_function = self.model.train_function
            self.model.train_function = _reading_only(self._train_function, skip)
            _start_at_epoch(self.model, epoch)
            self._vote = SigtermVote(job_world(strategy), vote_timeout(strategy))
            self._vote.start()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            from tfdist.resilience.pipeline_vote import stop_here

            self._steps += 1
            if self._steps <= self._restored:  # a step the checkpoint holds; nothing ran
                return
            stop_here(self._vote, self._saver, self._steps)
            if isinstance(save_freq, int) and self._steps % save_freq == 0:
                self._saver.save(self._steps)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if self._steps > self._restored:
                self._saver.save(self._steps)

        def on_train_end(self, logs: Any = None) -> None:
            self.model.train_function = self._train_function
            _start_at_epoch(self.model, None)
            self._vote.stop()
            if delete_checkpoint:
                shutil.rmtree(directory, ignore_errors=True)

    return PipelineBackupAndRestore()


class StepBackupMixin:
    """Saving at the step on SIGTERM, per rank: the pipeline's and the tensor strategy's (both
    hold different weights on each rank, and every rank must stop at the same step)."""

    worker_index: int
    preemption_saves = True

    def _step_backup(self, directory: str, **kwargs: Any) -> Any:
        """``backup_callback``'s callback for this rank's ``directory``: saves at the step on
        SIGTERM (`tfdist.resilience.pipeline_backup`); ``kwargs``: ``save_freq``,
        ``delete_checkpoint``."""
        return step_backup(self, directory, **kwargs)

    def backup_objects(self, model: Any, optimizer: Any = None) -> dict[str, Any]:
        """What a checkpoint of this rank's ``model`` must hold (`backup_objects`): the model
        and ``optimizer`` (default the model's), or under ZeRO stage 3 this process's pieces,
        the optimizer and the model's other variables. For the custom loop:
        ``tf.train.Checkpoint(step=step, **strategy.backup_objects(model, optimizer))``."""
        return backup_objects(model, optimizer)

    def preemption_handler(self, checkpoint: Any, directory: str | os.PathLike[str]) -> Any:
        """For a custom loop over `train_step`: run each step as ``handler.run(step, x, y)``;
        on SIGTERM every rank saves ``checkpoint`` in ``<directory>/rank-<r>`` at the same step
        and exits 75. Creating it restores that checkpoint; ``handler.total_run_calls`` is then
        the steps it holds (`tfdist.resilience.pipeline_vote.PipelinePreemptionHandler`).

        Raises:
            StrategyConfigError: ``checkpoint`` holds a model under ZeRO stage 3 (build it from
                `backup_objects` instead).
        """
        from tfdist.resilience.claim import claim_backup
        from tfdist.resilience.pipeline_vote import PipelinePreemptionHandler

        refuse_stage3_models(checkpoint)
        directory = os.fspath(directory)  # one job, the layout its backups were made for:
        claim_backup(self, os.path.join(directory, f"rank-{self.worker_index}"), directory)
        return PipelinePreemptionHandler(self, checkpoint, directory)


class PipelineBackupMixin(StepBackupMixin):
    """The backup half of `tfdist.strategies.pipeline.PipelineStrategy` (which supplies
    ``layout``, ``shards``, ``config``, ``bounds``, ``name``, ``worker_index`` and ``zero``)."""

    layout: Any
    shards: int
    config: Any
    bounds: Any
    name: str

    def backup_layout(self) -> dict[str, Any]:
        """What this process's backup depends on: the mesh, the chunks, (once the model is
        split) the stage bounds and the ZeRO stage if any (its optimizer slots are its part of
        its stage's); `tfdist.resilience.claim` refuses any other.

        Example:
            >>> from tfdist.strategies.pipeline import PipelineStrategy
            >>> PipelineStrategy().backup_layout()["stages"]
            1
        """
        layout = self.layout
        return {"strategy": self.name, "processes": layout.processes, "data": layout.replicas,
                "stages": layout.stages, "tensor": self.shards, "chunks": self.config.chunks,
                "stage_bounds": None if self.bounds is None else list(self.bounds),
                "zero": getattr(self, "zero", 0)}


def _check_save_freq(save_freq: Any) -> None:
    if save_freq == "epoch" or (isinstance(save_freq, int) and not isinstance(save_freq, bool)
                                and save_freq > 0):
        return
    raise StrategyConfigError(format_error(
        "The pipeline's backup saves every epoch, or every N steps.",
        received=f"save_freq={save_freq!r}", expected="'epoch' or a positive int",
        fix="pass save_freq='epoch' (the default) or save_freq=N"))


def _check_one_step_per_call(model: Any) -> None:
    steps = _steps_per_call(model)
    if steps != 1:
        raise StrategyConfigError(format_error(
            "The pipeline's backup saves at a step, so it needs one step per train-function "
            "call.", received=f"steps_per_execution={steps}", expected="steps_per_execution=1",
            fix="compile with steps_per_execution=1"))


def _steps_per_call(model: Any) -> int:
    """``steps_per_execution``: a variable in tf-keras, an int in Keras 3."""
    value = getattr(model, "_steps_per_execution", None)
    if value is None:
        value = getattr(model, "steps_per_execution", 1)
    return int(value.numpy()) if hasattr(value, "numpy") else int(value or 1)


def _steps_per_epoch(params: Any) -> int:
    steps = (params or {}).get("steps")
    if not steps:
        raise StrategyConfigError(format_error(
            "The pipeline's backup needs to know the steps of an epoch, to resume at a step.",
            received="a dataset of unknown length and no steps_per_epoch",
            expected="fit(..., steps_per_epoch=N), arrays, or a dataset of known cardinality",
            fix="pass steps_per_epoch to fit, or dataset.apply("
                "tf.data.experimental.assert_cardinality(N))"))
    return int(steps)


def _reading_only(run: Any, skip: int) -> Any:
    """``run`` (a train function) whose first ``skip`` calls take their batch from the input
    and run nothing: those steps are in the restored weights; the input stays in step."""
    remaining = [skip]

    def train_function(iterator: Any) -> Any:
        if remaining[0] > 0:
            remaining[0] -= 1
            next(iterator)
            return {}
        return run(iterator)

    return train_function


class _StartAtEpoch:
    """tf-keras's hook for a restored epoch (its ``_training_state``, as BackupAndRestore's)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def maybe_load_initial_counters_from_ckpt(self, steps: Any, initial_epoch: int,
                                              mode: Any = None) -> tuple[int, int]:
        return max(self.epoch, initial_epoch), 0


def _start_at_epoch(model: Any, epoch: int | None) -> None:
    """Makes ``fit`` start at ``epoch`` (None: as asked), in either Keras."""
    if flavour.flavour_of(model) == "keras3":
        model._initial_epoch = epoch or None
    else:
        model._training_state = None if epoch is None else _StartAtEpoch(epoch)

