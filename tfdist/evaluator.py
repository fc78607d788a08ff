"""The sidecar evaluator: evaluate the chief's checkpoints as they appear, for either Keras.

The ``evaluator`` task of a job (``tfdist-launch --evaluator``) runs the training script too, but
must not train: it builds the same model, then `run_sidecar_evaluator` waits for each new
checkpoint the chief writes, restores the model's weights from it, evaluates them on held-out
data, and returns once the checkpoint of the final epoch has been evaluated (or no new checkpoint
came for ``timeout_seconds``). tf-keras has ``SidecarEvaluator`` for this; Keras 3 has none, so
this one implementation serves both.

The checkpoints are ``tf.train.Checkpoint(model=model, epoch=<int64 variable>)`` objects saved with
``strategy.save_checkpoint(..., checkpoint_number=epoch)``, one per epoch, under one directory;
``keras_examples/common.py`` writes them from a callback.

Example:
    >>> import tfdist.evaluator
    >>> tfdist.evaluator.is_evaluator({"TF_CONFIG": '{"task": {"type": "evaluator", "index": 0}}'})
    True
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from tfdist.cluster import peek_tf_config
from tfdist.errors import ClusterConfigError, EvaluatorTimeoutError

EvaluateFn = Callable[[Any], Mapping[str, float]]
_CHECKPOINT_NUMBER = re.compile(r"-(\d+)$")


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """The metrics of one checkpoint."""

    checkpoint: str
    epoch: int
    metrics: dict[str, float]
    seconds: float

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def is_evaluator(source: Any = None) -> bool:
    """Whether this process is the evaluator task.

    Args:
        source: A tfdist strategy (its ``task_type``), an environment mapping, or None for
            ``os.environ``; the environment is read through its ``TF_CONFIG``.

    Example:
        >>> is_evaluator({})
        False
    """
    if source is not None and not isinstance(source, Mapping):
        if getattr(source, "task_type", None) == "evaluator":
            return True
        source = None
    try:
        view = peek_tf_config(source)
    except ClusterConfigError:
        return False
    return view is not None and view.task_type == "evaluator"


def run_sidecar_evaluator(
    model: Any,
    checkpoint_dir: str | os.PathLike[str],
    evaluate: EvaluateFn | tuple[Any, Any],
    *,
    final_epoch: int | None = None,
    max_evaluations: int | None = None,
    timeout_seconds: float = 600.0,
    poll_seconds: float = 1.0,
    results_path: str | os.PathLike[str] | None = None,
    log: Callable[[str], None] | None = None,
) -> list[Evaluation]:
    """Evaluates each new checkpoint in ``checkpoint_dir`` until the final epoch's.

    Args:
        model: The model the checkpoints were saved from (same architecture), already built.
        checkpoint_dir: Where the chief saves ``tf.train.Checkpoint(model=..., epoch=...)``.
        evaluate: ``fn(model) -> {metric: value}``, or ``(x, y)`` for ``model.evaluate`` (the
            model must then be compiled).
        final_epoch: Stop after the checkpoint of this epoch (1-based) has been evaluated.
        max_evaluations: Stop after this many evaluations.
        timeout_seconds: Stop when no new checkpoint appears for this long.
        poll_seconds: How often to look for a new checkpoint.
        results_path: If set, one JSON line per evaluation is appended there.
        log: Where the one line per checkpoint goes (default ``print``).

    Returns:
        The evaluations, oldest first.

    Raises:
        EvaluatorTimeoutError: Not one checkpoint appeared within ``timeout_seconds``.

    Example:
        >>> import tempfile, tensorflow as tf
        >>> model = tf.Module(); model.w = tf.Variable(1.0)
        >>> directory = tempfile.mkdtemp()
        >>> _ = tf.train.Checkpoint(model=model, epoch=tf.Variable(1, dtype=tf.int64)).save(
        ...     directory + "/ckpt")
        >>> results = run_sidecar_evaluator(model, directory, lambda m: {"w": float(m.w)},
        ...                                 final_epoch=1, timeout_seconds=5, log=lambda s: None)
        >>> results[0].epoch, results[0].metrics
        (1, {'w': 1.0})
    """
    import tensorflow as tf

    log = log or (lambda line: print(line, flush=True))
    evaluate_fn = _as_evaluate_fn(evaluate)
    epoch = tf.Variable(-1, dtype=tf.int64, trainable=False)
    reader = tf.train.Checkpoint(model=model, epoch=epoch)
    results: list[Evaluation] = []
    for path in tf.train.checkpoints_iterator(
        os.fspath(checkpoint_dir), min_interval_secs=poll_seconds, timeout=timeout_seconds
    ):
        evaluation = _evaluate_one(reader, epoch, path, evaluate_fn, log)
        if evaluation is None:
            continue
        results.append(evaluation)
        if results_path is not None:
            _append_json_line(results_path, evaluation.as_json())
        if final_epoch is not None and evaluation.epoch >= final_epoch:
            return results
        if max_evaluations is not None and len(results) >= max_evaluations:
            return results
    if not results:
        raise EvaluatorTimeoutError(
            f"No checkpoint appeared in {os.fspath(checkpoint_dir)!r} within {timeout_seconds:g} "
            f"s. Expected the chief to save one per epoch there. Fix: check that the chief runs "
            f"and saves checkpoints to this directory, or raise timeout_seconds")
    log(f"[evaluator] no new checkpoint for {timeout_seconds:g} s; stopping after "
        f"{len(results)} evaluation(s), last epoch {results[-1].epoch}"
        + (f" of {final_epoch}" if final_epoch is not None else ""))
    return results


def _as_evaluate_fn(evaluate: EvaluateFn | tuple[Any, Any]) -> EvaluateFn:
    if callable(evaluate):
        return evaluate
    if isinstance(evaluate, tuple) and len(evaluate) == 2:
        x, y = evaluate
        return lambda model: model.evaluate(x, y, verbose=0, return_dict=True)
    raise TypeError(f"evaluate must be a function of the model or an (x, y) pair. Received: "
                    f"{type(evaluate).__name__}. Fix: pass lambda model: {{'metric': value}} "
                    f"or (x_test, y_test)")


def _evaluate_one(
    reader: Any, epoch: Any, path: str, evaluate_fn: EvaluateFn, log: Callable[[str], None]
) -> Evaluation | None:
    """Restores ``path`` and evaluates it; None if it vanished first (the chief keeps a few)."""
    import tensorflow as tf

    started = time.perf_counter()
    epoch.assign(-1)
    try:
        reader.restore(path).expect_partial()
    except (tf.errors.NotFoundError, ValueError) as err:
        log(f"[evaluator] skipping {os.path.basename(path)}: could not read it ({err})")
        return None
    number = int(epoch.numpy())
    if number < 0:  # a checkpoint without an epoch counter: its file number stands in
        match = _CHECKPOINT_NUMBER.search(path)
        number = int(match.group(1)) if match else 0
    metrics = {k: float(v) for k, v in evaluate_fn(reader.model).items()}
    shown = ", ".join(f"{k}={v:.4f}" for k, v in metrics.items())
    log(f"[evaluator] checkpoint {os.path.basename(path)} (epoch {number}): {shown}")
    return Evaluation(path, number, metrics, time.perf_counter() - started)


def _append_json_line(path: str | os.PathLike[str], record: Mapping[str, Any]) -> None:
    directory = os.path.dirname(os.fspath(path))
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(path, "a") as out:
        out.write(json.dumps(record) + "\n")
