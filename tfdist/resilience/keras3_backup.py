"""Keras 3 ``fit`` that saves at the step on SIGTERM and resumes there (MultiWorkerMirrored).

Keras 3's ``BackupAndRestore`` knows epochs only. tf-keras's saves at the step through TF's
``PreemptionCheckpointHandler``; this callback does the same for Keras 3 (`step_backup`):

* ``on_train_begin``: one ``tf.train.Checkpoint`` of the model and optimizer, handed to a
  ``PreemptionCheckpointHandler`` on ``directory`` with tfdist's termination config (save at the
  next step all workers agree on, print the marker, exit 75). The handler restores the last
  checkpoint (on every worker, from the chief's directory) and its count of saved runs, which
  is the global step ``g``: one run per step. ``fit`` then starts at epoch ``g // steps``, the
  first ``g % steps`` calls of that epoch's train function return without running (the model
  and optimizer already hold them), and the input resumes at step ``g``
  (``strategy._resume_input_at``, `tfdist.resilience.preemption.skip_at_start`).
* ``on_train_batch_end``: one run counted; the handler saves and exits here if a worker was
  SIGTERMed. ``on_epoch_end`` saves too, so a crash (not a SIGTERM) resumes at the epoch.
* ``on_train_end``: the watcher stops, SIGTERM ends the process again, and the chief deletes
  the backup (a finished job starts afresh, as Keras's callback does).

One step per train-function call: ``steps_per_execution`` must be 1.
"""

from __future__ import annotations

import os
import shutil
import signal
from typing import Any

from tfdist.core import flavour
from tfdist.errors import StrategyConfigError, format_error

__all__ = ["step_backup"]


def step_backup(strategy: Any, directory: str) -> Any:
    """The Keras 3 callback described in the module docstring, for a MultiWorkerMirrored
    ``strategy`` (a tfdist strategy: ``cluster_resolver``, ``is_chief``, ``_resume_input_at``)."""
    keras = flavour.get_keras("keras3")

    class StepBackupAndRestore(keras.callbacks.Callback):
        """Saves at the step on SIGTERM and resumes there (`tfdist.resilience.keras3_backup`)."""

        def __init__(self) -> None:
            super().__init__()
            self.backup_dir = directory
            self._handler: Any = None
            self._sigterm_before: Any = None
            self._train_function: Any = None

        def on_train_begin(self, logs: Any = None) -> None:
            _check_one_step_per_call(self.model)
            self._sigterm_before = signal.getsignal(signal.SIGTERM)
            self._handler = _handler(strategy, self.model, directory)
            steps = int(self.params["steps"])
            done = int(self._handler._checkpointed_runs.numpy())
            self.model._initial_epoch = done // steps or None
            strategy._resume_input_at(done)
            self._train_function = self.model.train_function
            self.model.train_function = _skipping(self._train_function, done % steps)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self._handler._run_counter += 1
            self._handler._check_preemption_and_maybe_checkpoint()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self._handler._save_checkpoint()

        def on_train_end(self, logs: Any = None) -> None:
            self.model.train_function = self._train_function
            self._handler._stop_cluster_wise_termination_watcher_thread()
            signal.signal(signal.SIGTERM, self._sigterm_before or signal.SIG_DFL)
            if strategy.is_chief:
                shutil.rmtree(directory, ignore_errors=True)

    return StepBackupAndRestore()


def _check_one_step_per_call(model: Any) -> None:
    steps = int(getattr(model, "steps_per_execution", 1) or 1)
    if steps != 1:
        raise StrategyConfigError(format_error(
            "Saving at the step on SIGTERM under Keras 3 needs one step per train-function call.",
            received=f"steps_per_execution={steps}", expected="steps_per_execution=1",
            fix="compile with steps_per_execution=1, or pass save_before_preemption=False to "
            "backup_callback (the job then resumes at its last epoch)"))


def _handler(strategy: Any, model: Any, directory: str) -> Any:
    import tensorflow as tf

    from tfdist.resilience.preemption import termination_config

    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    made: list[Any] = []

    def after_save() -> str:
        return f"step {int(made[0]._checkpointed_runs.numpy())}, in {directory}"

    handler = tf.distribute.experimental.PreemptionCheckpointHandler(
        strategy.cluster_resolver, checkpoint, os.fspath(directory),
        termination_config=termination_config(after_save))
    made.append(handler)
    return handler


def _skipping(run: Any, skip: int) -> Any:
    """``run`` (a train function) whose first ``skip`` calls run nothing: those steps are already
    in the restored weights, and the input resumes after them."""
    remaining = [skip]

    def train_function(iterator: Any) -> Any:
        if remaining[0] > 0:
            remaining[0] -= 1
            return {}
        return run(iterator)

    return train_function
