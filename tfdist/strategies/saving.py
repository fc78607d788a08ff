"""How a strategy saves once: the chief writes, other workers join a collective save or skip it.

`SavingMixin` is the saving half of `tfdist.strategies.base.TfdistStrategyMixin`: `write_path`,
`save_model`, `save_checkpoint`, `restore_checkpoint`, and the ``fit`` callbacks that save
(`backup_callback`, `checkpoint_callback`) or save on SIGTERM (`preemption_handler`). A backend
changes it through ``every_worker_saves`` and `_writing`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Any

import tensorflow as tf

from tfdist.errors import StrategyConfigError, format_error
from tfdist.logs import report_written
from tfdist.paths import file_problem

__all__ = ["SavingMixin"]

_TEMP_PREFIX = ".tfdist-tmp-"
"""The folder a non-chief worker writes its share of a collective save to (then deleted)."""

class SavingMixin:
    """Saving once, for `TfdistStrategyMixin` (which supplies ``is_chief``, ``task_type``,
    ``task_index``, ``every_worker_saves`` and ``_tfdist_managers``)."""

    def backup_callback(self, directory: str | os.PathLike[str], **kwargs: Any) -> Any:
        """A Keras ``BackupAndRestore`` for ``model.fit`` that is safe under this backend.

        Pass the same ``directory`` on every process; a restarted job resumes from its last
        completed epoch. See `tfdist.resilience.backup` for how each backend lays it out.

        Example:
            >>> import tempfile, tfdist.strategies
            >>> strategy = tfdist.strategies.get_strategy("default")
            >>> callback = strategy.backup_callback(tempfile.mkdtemp())
            >>> type(callback).__name__
            'BackupAndRestore'
        """
        from tfdist.resilience.backup import backup_callback

        callback = backup_callback(self, directory, **kwargs)
        if self.is_chief:
            report_written("backups", directory)
        return callback

    def preemption_handler(
        self, checkpoint: tf.train.Checkpoint, directory: str | os.PathLike[str]
    ) -> Any:
        """For a custom loop: saves ``checkpoint`` at the current step on SIGTERM, then exits 75.

        Creating it restores the latest checkpoint in ``directory``, and makes the next iterator
        over a `distribute_dataset` start where that step left the input; so create it before
        the iterator. Run each step as ``handler.run(train_step, next(iterator))``
        (one step per call); track the step in a variable of ``checkpoint``
        (`tfdist.resilience.preemption` says what happens on SIGTERM).

        Raises:
            StrategyConfigError: this strategy does not save on SIGTERM (`preemption_saves`).

        Example:
            >>> import tempfile, tfdist.strategies
            >>> strategy = tfdist.strategies.get_strategy("default")
            >>> strategy.preemption_handler(tf.train.Checkpoint(), tempfile.mkdtemp())
            Traceback (most recent call last):
            ...
            tfdist.errors.StrategyConfigError: This strategy cannot save ... Received: ...
        """
        from tfdist.resilience.preemption import preemption_handler

        return preemption_handler(self, checkpoint, os.fspath(directory))

    def checkpoint_callback(self, filepath: str | os.PathLike[str], **kwargs: Any) -> Any:
        """A Keras ``ModelCheckpoint`` that writes ``filepath`` once, from the chief.

        Pass it on every process (see `tfdist.resilience.backup.model_checkpoint_callback`).

        Example:
            >>> import tempfile, tfdist.strategies
            >>> strategy = tfdist.strategies.get_strategy("default")
            >>> callback = strategy.checkpoint_callback(tempfile.mkdtemp() + "/w.weights.h5",
            ...                                         save_weights_only=True)
            >>> type(callback).__name__
            'ModelCheckpoint'
        """
        from tfdist.resilience.backup import model_checkpoint_callback

        return model_checkpoint_callback(self, filepath, **kwargs)

    def write_path(self, path: str | os.PathLike[str]) -> str | None:
        """Where this process writes what belongs at ``path``.

        The chief writes ``path``. Under `every_worker_saves` (MultiWorkerMirrored), any other
        worker must also take part in the save, and writes to
        ``<dirname>/.tfdist-tmp-<task_type>-<index>/<basename>`` instead (the pattern of TF's
        multi-worker Keras tutorial); `save_model` and `save_checkpoint` delete it afterwards.
        Otherwise a non-chief gets None: it must not write.

        Example:
            >>> import tfdist.strategies
            >>> tfdist.strategies.get_strategy("default").write_path("/tmp/model.keras")
            '/tmp/model.keras'
        """
        path = os.fspath(path)
        if self.is_chief:
            return path
        if not self.every_worker_saves:
            return None
        tag = f"{_TEMP_PREFIX}{self.task_type}-{self.task_index}"
        head, tail = os.path.split(path.rstrip("/"))
        return os.path.join(head, tag, tail)

    def _discard(self, written: str) -> None:
        if self.is_chief:
            return
        temp_dir = os.path.dirname(written)
        if os.path.basename(temp_dir).startswith(_TEMP_PREFIX):
            shutil.rmtree(temp_dir, ignore_errors=True)

    def _writing(self) -> contextlib.AbstractContextManager[None]:
        """Context of a write that not every process makes (Horovod: no broadcasts inside)."""
        return contextlib.nullcontext()

    def save_model(self, model: Any, filepath: str | os.PathLike[str], **kwargs: Any) -> str | None:
        """Saves ``model`` once: to ``filepath`` on the chief (see `write_path` for the others).

        Call it on every process: under MultiWorkerMirrored the save is a collective.

        Args:
            model: A Keras model (either flavour).
            filepath: Passed to ``model.save`` (Keras 3 needs a ``.keras`` name).
            **kwargs: Passed to ``model.save``.

        Returns:
            ``filepath`` on the chief, None elsewhere.

        Example:
            >>> import tempfile, tfdist.strategies
            >>> keras = tfdist.core.flavour.get_keras()
            >>> strategy = tfdist.strategies.get_strategy("default")
            >>> with strategy.scope():
            ...     model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            >>> path = strategy.save_model(model, tempfile.mkdtemp() + "/m.keras")
            >>> path.endswith("m.keras")
            True
        """
        written = self.write_path(filepath)
        if written is None:
            return None
        # every process saves, even to a rescue path: under MultiWorkerMirrored it is a collective
        self._save_or_rescue(model, written, os.fspath(filepath), kwargs, collective=True)
        self._discard(written)
        if self.is_chief:
            report_written("model", written)
        return written if self.is_chief else None

    def _save_or_rescue(self, model: Any, written: str, filepath: str, kwargs: dict[str, Any],
                        collective: bool) -> None:
        """``model.save(written)``; where ``written`` cannot be written, saves to a new
        temporary directory instead and raises an error that names it: the trained model is
        never lost to a bad path. The one save path of every strategy.

        A write that fails only while writing (a read-only file system) is rescued too, unless
        the save is ``collective`` (the other processes are inside the same save).
        """
        problem = file_problem(written)
        target = written if problem is None else _rescue_path(written)
        try:
            os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
            with self._writing():
                model.save(target, **kwargs)
        except OSError as err:
            if collective or problem is not None:
                raise
            problem, target = f"{type(err).__name__}: {err}", _rescue_path(written)
            model.save(target, **kwargs)
        if problem is not None:
            self._refuse_unwritable_save(filepath, problem, target)

    def _refuse_unwritable_save(self, filepath: str, problem: str, rescued: str) -> None:
        if not self.is_chief:
            shutil.rmtree(os.path.dirname(rescued), ignore_errors=True)
        where = (f"the trained model was saved to {rescued} instead" if self.is_chief
                 else "the chief saved the trained model elsewhere (its error names where)")
        move = rescued if self.is_chief else "where the chief's error names"
        raise StrategyConfigError(format_error(
            f"save_model cannot write {filepath!r}: {problem}; {where}.", received=filepath,
            expected="a path of a new file whose directories can be created and written",
            fix=f"move the rescued model from {move} to where you want it; next time save to a "
                "new file in a writable directory (not a directory, not under a file)"))

    def save_checkpoint(
        self,
        checkpoint: tf.train.Checkpoint,
        directory: str | os.PathLike[str],
        max_to_keep: int = 3,
        checkpoint_number: int | None = None,
    ) -> str | None:
        """Saves ``checkpoint`` under ``directory`` once, keeping the last ``max_to_keep``.

        Call it on every process (see `save_model`). ``checkpoint_number`` names the file
        (``ckpt-<number>``, e.g. the epoch); by default the checkpoint's own save counter.

        Returns:
            The checkpoint's path prefix on the chief, None elsewhere.

        Example:
            >>> import tempfile, tfdist.strategies
            >>> strategy = tfdist.strategies.get_strategy("default")
            >>> ckpt = tf.train.Checkpoint(step=tf.Variable(3))
            >>> strategy.save_checkpoint(ckpt, tempfile.mkdtemp()).endswith("ckpt-1")
            True
        """
        written = self.write_path(directory)
        if written is None:
            return None
        with self._writing():
            manager = self._tfdist_managers.get(written)
            if manager is None:
                manager = tf.train.CheckpointManager(checkpoint, written, max_to_keep=max_to_keep)
                self._tfdist_managers[written] = manager
            prefix = manager.save(checkpoint_number=checkpoint_number)
        if not self.is_chief:
            self._discard(written)
            self._tfdist_managers.pop(written, None)
        return prefix if self.is_chief else None

    def restore_checkpoint(
        self, checkpoint: tf.train.Checkpoint, directory: str | os.PathLike[str]
    ) -> str | None:
        """Restores the chief's latest checkpoint in ``directory`` (every process reads it).

        Returns:
            The restored path prefix, or None if ``directory`` holds no checkpoint yet.

        Example:
            >>> import tempfile, tfdist.strategies
            >>> strategy = tfdist.strategies.get_strategy("default")
            >>> strategy.restore_checkpoint(tf.train.Checkpoint(), tempfile.mkdtemp()) is None
            True
        """
        latest = tf.train.latest_checkpoint(os.fspath(directory))
        if latest is not None:
            checkpoint.restore(latest)
        return latest


def _rescue_path(path: str) -> str:
    """Where a trained model goes when ``path`` cannot be written: a new private temp dir."""
    return os.path.join(tempfile.mkdtemp(prefix="tfdist-rescued-model-"), os.path.basename(path))
