"""``BackupAndRestore`` that works the same under every strategy and both Keras flavours.

Keras's own callback is multi-worker aware only in tf-keras, and only for the strategies it knows:

* tf-keras under MultiWorkerMirrored: non-chief workers back up to temporary directories;
  under ParameterServer only the chief runs the script. Both use ``directory`` as it is.
* Keras 3's callback knows nothing of workers: under MultiWorkerMirrored every worker would
  write, and at the end delete, the same files at once. Every worker restores from
  ``directory`` (all hold the same weights), but only the chief writes or deletes it. Under
  ParameterServer only the chief runs the script (`tfdist.fit` calls the callback there).
* Under Horovod each rank is a one-device strategy that thinks it is alone: every rank would
  write, and at the end delete, the same files at once (and tf-keras refuses a one-device
  strategy outright). So each rank keeps its own ``<directory>/rank-<r>``; siblings, so no rank
  deletes another's. All ranks hold the same weights at an epoch's end, so every rank's backup
  restores the same state. A rank that died before writing its last backup would resume one
  epoch behind the others: ranks must be restarted together, which is what
  ``tfdist-launch --max-restarts`` does.
* The pipeline keeps per-rank backups too (each stage holds different weights). A rank is the
  process's ``worker_index``: with ``--chief``, chief:0 is rank 0 and worker:i rank i+1. Its
  callback, in either Keras, saves at the step on SIGTERM once every stage agreed on it
  (`tfdist.resilience.pipeline_backup`); with ``save_before_preemption=False`` it is Keras's own.

Saving on SIGTERM (`tfdist.resilience.preemption`), where the strategy's ``preemption_saves``
says so (MultiWorkerMirrored, tf-keras): tf-keras can save at the step a worker is in through TF's
``PreemptionCheckpointHandler`` (``save_before_preemption``), but switches it on only on Google
Cloud. tfdist switches it on everywhere, with its own termination config (save at the next step
all workers agree on, exit 75), and on restore makes the input resume at that step as well
(`tfdist.resilience.preemption.skip_at_start`). Keras 3's callback restores only the epoch;
under Keras 3 tfdist's own callback saves and resumes at the step
(`tfdist.resilience.keras3_backup`).
"""

from __future__ import annotations

import os
import shutil
import signal
from typing import Any

from tfdist.core import flavour
from tfdist.errors import StrategyConfigError, format_error
from tfdist.paths import directory_problem, file_problem
from tfdist.resilience.claim import claim_backup, release_backup

__all__ = ["backup_callback", "model_checkpoint_callback"]


def model_checkpoint_callback(
    strategy: Any, filepath: str | os.PathLike[str], **kwargs: Any
) -> Any:
    """A Keras ``ModelCheckpoint`` that writes ``filepath`` once, under any strategy and Keras.

    tf-keras's callback is multi-worker aware (every worker must run it: its save is a
    collective, and non-chief workers write to temporary directories it deletes). Keras 3's is
    not, and its save is no collective: the chief gets the callback, the others a no-op.

    Args:
        strategy: A tfdist strategy.
        filepath: Passed to ``ModelCheckpoint`` (the same on every process).
        **kwargs: Passed to ``ModelCheckpoint`` (``save_weights_only``, ``monitor``...).

    Raises:
        StrategyConfigError: ``filepath`` cannot be written (checked now, not after an epoch).
    """
    problem = file_problem(filepath)
    if problem:
        raise StrategyConfigError(format_error(
            f"The checkpoint file cannot be written: {problem}.", received=os.fspath(filepath),
            expected="a path whose directories this process can create and write",
            fix="pass checkpoint_callback a path that is not under a file"))
    keras = flavour.get_keras()
    if flavour.keras_flavour() == "tf_keras" or strategy.is_chief:
        return keras.callbacks.ModelCheckpoint(os.fspath(filepath), **kwargs)
    return keras.callbacks.Callback()


def backup_callback(
    strategy: Any,
    directory: str | os.PathLike[str],
    *,
    save_before_preemption: bool | None = None,
    **kwargs: Any,
) -> Any:
    """A ``BackupAndRestore`` callback for this process, of the Keras flavour in use.

    Args:
        strategy: A tfdist strategy (its ``per_rank_backups`` decides the layout).
        directory: The job's backup directory (the same on every process).
        save_before_preemption: Save at the current step on SIGTERM and exit 75 (None: wherever
            the strategy and this Keras support it).
        **kwargs: Passed to Keras's ``BackupAndRestore`` (e.g. ``save_freq``).

    Raises:
        StrategyConfigError: ``save_before_preemption=True`` where it cannot work, a
            ``directory`` that cannot be written (checked now, not after the first epoch), one
            another running job uses, or one whose backups were written for another layout
            (`tfdist.resilience.claim`).
    """
    directory = os.fspath(directory)
    problem = directory_problem(directory)
    if problem:
        raise StrategyConfigError(format_error(
            f"The backup directory cannot be written: {problem}.", received=directory,
            expected="a directory this process can create and write",
            fix="pass backup_callback a directory path that is not under a file"))
    preempt = _preemption_wanted(strategy, save_before_preemption)
    per_rank = bool(getattr(strategy, "per_rank_backups", False))
    job_directory = directory
    if per_rank:  # worker_index: chief 0, then the workers (task_index repeats across roles)
        directory = os.path.join(directory, f"rank-{strategy.worker_index}")
    if per_rank or strategy.is_chief:  # the processes that write it
        claim_backup(strategy, directory, job_directory)
    if preempt and hasattr(strategy, "_step_backup"):  # the pipeline's, either Keras
        return strategy._step_backup(directory, **kwargs)
    keras = flavour.get_keras()
    if flavour.keras_flavour() == "keras3":
        if preempt:
            from tfdist.resilience.keras3_backup import step_backup

            return step_backup(strategy, directory)
        if strategy.is_chief or per_rank:
            return keras.callbacks.BackupAndRestore(directory, **kwargs)
        return _keras3_reader_backup(keras, directory, kwargs)
    return _tf_keras_backup(keras, strategy, directory, per_rank, preempt, kwargs)


def _keras3_reader_backup(keras: Any, directory: str, kwargs: dict[str, Any]) -> Any:
    class RestoreOnlyBackupAndRestore(keras.callbacks.BackupAndRestore):
        """Keras 3's callback for a non-chief worker: restores from the chief's backup at the
        start, never writes or deletes it (the chief does, with the same weights)."""

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            pass

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            pass

        def on_train_end(self, logs: Any = None) -> None:
            pass

    return RestoreOnlyBackupAndRestore(directory, **kwargs)


def _preemption_wanted(strategy: Any, requested: bool | None) -> bool:
    supported = bool(getattr(strategy, "preemption_saves", False))
    if supported:
        return requested is not False
    if requested:
        raise StrategyConfigError(
            format_error(
                "save_before_preemption needs a strategy that saves on SIGTERM.",
                received=f"strategy {getattr(strategy, 'name', strategy)!r} with "
                f"{flavour.keras_flavour()}",
                expected="multi_worker or pipeline (either Keras)",
                fix="leave save_before_preemption unset (the job then resumes from its last "
                "backup), or pass save_freq=N to back up every N steps",
            )
        )
    return False


def _tf_keras_backup(
    keras: Any, strategy: Any, directory: str, per_rank: bool, preempt: bool,
    kwargs: dict[str, Any],
) -> Any:
    import tensorflow as tf

    class TfdistBackupAndRestore(keras.callbacks.BackupAndRestore):
        """tf-keras's callback, on one-device strategies too, saving on SIGTERM where asked.

        tf-keras refuses strategies outside its list, though a one-device strategy (Horovod's)
        needs nothing more than no strategy. It deletes the backup at the end only where
        ``should_checkpoint`` (Horovod: rank 0); the other ranks delete their own directory here.
        """

        def __init__(self) -> None:
            super().__init__(directory, **kwargs)
            self._supported_strategies += (tf.distribute.OneDeviceStrategy,)
            self._sigterm_before: Any = None

        def on_train_begin(self, logs: Any = None) -> None:
            super().on_train_begin(logs)
            state = self._training_state
            if preempt:
                self._sigterm_before = signal.getsignal(signal.SIGTERM)
                _watch_for_sigterm(state, strategy, self.model)
            steps = self.params.get("steps") if self.params else None
            if steps:
                epoch, step = state.maybe_load_initial_counters_from_ckpt(steps, 0, "train")
                strategy._resume_input_at(epoch * steps + step)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            # tf-keras records the first step of an execution (on_train_batch_begin); with
            # steps_per_execution > 1 a save would then claim fewer steps than it holds.
            self._training_state._ckpt_saved_batch.assign(batch)
            super().on_train_batch_end(batch, logs)

        def _implements_train_batch_hooks(self) -> bool:
            return preempt or super()._implements_train_batch_hooks()

        def on_train_end(self, logs: Any = None) -> None:
            if preempt:
                _stop_watching(self._training_state, self.model, self._sigterm_before)
            super().on_train_end(logs)
            if self.delete_checkpoint and per_rank:
                shutil.rmtree(self.backup_dir, ignore_errors=True)
            elif self.delete_checkpoint and strategy.is_chief:
                release_backup(self.backup_dir)  # tf-keras deleted its checkpoint files only

    return TfdistBackupAndRestore()


def _watch_for_sigterm(state: Any, strategy: Any, model: Any) -> None:
    """Switches on tf-keras's save-before-preemption path (what it does on Google Cloud)."""
    import tensorflow as tf
    from tf_keras.src.distribute import distributed_file_utils

    from tfdist.resilience.preemption import termination_config

    read, write = state.read_checkpoint_manager, state.write_checkpoint_manager

    def after_save() -> str:
        if write is not read:
            distributed_file_utils.remove_temp_dirpath(write.directory, strategy)
        epoch, batch = int(state._ckpt_saved_epoch.numpy()), int(state._ckpt_saved_batch.numpy())
        return f"epoch {epoch + 1}, after step {batch + 1}, in {read.directory}"

    handler = tf.distribute.experimental.PreemptionCheckpointHandler(
        strategy.cluster_resolver, write, termination_config=termination_config(after_save)
    )
    handler._read_checkpoint_manager = read
    # Workers agree on "save after run N" by their own counts. The handler restored the saved
    # count on the chief only (the others write to a temporary directory), so count this fit's
    # steps from 0 everywhere.
    handler._run_counter = 0
    state._enable_save_before_preemption = True
    state.preemption_handler = handler
    model._preemption_handler = handler


def _stop_watching(state: Any, model: Any, sigterm_before: Any) -> None:
    """After ``fit``: SIGTERM ends the process again, and the handler's threads stop."""
    handler = getattr(state, "preemption_handler", None)
    if handler is not None:
        handler._stop_cluster_wise_termination_watcher_thread()
    if getattr(model, "_preemption_handler", None) is handler:
        del model._preemption_handler
    signal.signal(signal.SIGTERM, sigterm_before or signal.SIG_DFL)
