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
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from tfdist import compat

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
    """
    keras = compat.get_keras()
    if compat.keras_flavour() == "tf_keras" or strategy.is_chief:
        return keras.callbacks.ModelCheckpoint(os.fspath(filepath), **kwargs)
    return keras.callbacks.Callback()


def backup_callback(strategy: Any, directory: str | os.PathLike[str], **kwargs: Any) -> Any:
    """A ``BackupAndRestore`` callback for this process, of the Keras flavour in use.

    Args:
        strategy: A tfdist strategy (its ``per_rank_backups`` decides the layout).
        directory: The job's backup directory (the same on every process).
        **kwargs: Passed to Keras's ``BackupAndRestore`` (e.g. ``save_freq``).
    """
    directory = os.fspath(directory)
    per_rank = bool(getattr(strategy, "per_rank_backups", False))
    if per_rank:
        directory = os.path.join(directory, f"rank-{strategy.task_index}")
    keras = compat.get_keras()
    if compat.keras_flavour() == "keras3":
        if strategy.is_chief or per_rank:
            return keras.callbacks.BackupAndRestore(directory, **kwargs)
        return _keras3_reader_backup(keras, directory, kwargs)
    return _tf_keras_backup(keras, directory, per_rank, kwargs)


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


def _tf_keras_backup(keras: Any, directory: str, per_rank: bool, kwargs: dict[str, Any]) -> Any:
    import tensorflow as tf

    class OneDeviceBackupAndRestore(keras.callbacks.BackupAndRestore):
        """tf-keras's callback, also accepting one-device strategies (Horovod's is one).

        tf-keras refuses strategies outside its list, though a one-device strategy needs nothing
        more than no strategy. It deletes the backup at the end only where ``should_checkpoint``
        (Horovod: rank 0); the other ranks delete their own directory here.
        """

        def __init__(self) -> None:
            super().__init__(directory, **kwargs)
            self._supported_strategies += (tf.distribute.OneDeviceStrategy,)

        def on_train_end(self, logs: Any = None) -> None:
            super().on_train_end(logs)
            if self.delete_checkpoint and per_rank:
                shutil.rmtree(self.backup_dir, ignore_errors=True)

    return OneDeviceBackupAndRestore()
