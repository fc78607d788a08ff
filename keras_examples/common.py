"""What the examples share: command line, strategy creation, backups, crash hook, summary.

The examples import this module as ``common`` (Python puts the script's directory on ``sys.path``).
Nothing here is needed to use tfdist; it keeps each example about its model and data.

Sidecar evaluator: every example saves ``tf.train.Checkpoint(model=..., epoch=...)`` to
``<model-dir>/checkpoints/ckpt-<epoch>`` after each epoch (written once, by the chief). The
``evaluator`` task of a job (``tfdist-launch --evaluator``) trains nothing: `evaluate_checkpoints`
evaluates those checkpoints as they appear, appends one JSON line per checkpoint to
``<model-dir>/eval/results.jsonl``, and reports ``{"role": "evaluator", ...}``.

Test hook: ``TFDIST_EXAMPLE_CRASH_AFTER_EPOCH=k`` makes an example exit with status
`CRASH_EXIT_STATUS` right after epoch ``k`` (1-based) has been backed up, on every process, as a
preempted job would. A run resumed from that backup starts at epoch ``k + 1`` and so never reaches
the crash point again: the same environment can be used for the crashed run and its restart
(``tfdist-launch --max-restarts 1``).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import tfdist
import tfdist.testing
from tfdist.core import flavour
from tfdist.core.traits import STRATEGY_ENV
from tfdist.strategies import strategy_traits

CRASH_ENV = "TFDIST_EXAMPLE_CRASH_AFTER_EPOCH"
CRASH_EXIT_STATUS = 42
MODEL_FILE = "model.keras"
CHECKPOINT_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"
EVAL_RESULTS = os.path.join("eval", "results.jsonl")


def base_parser(description: str, *, epochs: int, batch_size: int, learning_rate: float,
                model_dir: str) -> argparse.ArgumentParser:
    """The options every example takes; an example adds its own to the returned parser."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--strategy", default=os.environ.get(STRATEGY_ENV, "auto"),
                        help="tfdist strategy name (default: auto, or env TFDIST_STRATEGY)")
    parser.add_argument("--epochs", type=int, default=epochs, help=f"default {epochs}")
    parser.add_argument("--per-replica-batch-size", type=int, default=batch_size,
                        help=f"default {batch_size}; the global batch is this x replicas")
    parser.add_argument("--learning-rate", type=float, default=learning_rate,
                        help=f"for one replica (default {learning_rate}); scaled linearly by "
                        "the number of replicas")
    parser.add_argument("--model-dir", default=model_dir, type=writable_dir,
                        help=f"backups, checkpoints and the final model (default {model_dir}); "
                        "checked at start")
    parser.add_argument("--evaluator-timeout", type=float, default=600.0,
                        help="evaluator task only: stop when no new checkpoint appears for this "
                        "many seconds (default 600)")
    return parser


def writable_dir(path: str) -> str:
    """``path`` once it exists and can be written (an argparse type: a bad one is a usage error
    at start, not a traceback after the first epoch)."""
    try:
        os.makedirs(path, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(f"{path!r} is not writable")
    except OSError as err:
        raise argparse.ArgumentTypeError(
            f"cannot write to {path!r} ({err.strerror or err}). Fix: pass a --model-dir you can "
            "create and write") from err
    return path


def strategy_name(requested: str) -> str:
    """The concrete strategy ``requested`` stands for (``auto`` resolved from the environment)."""
    if requested != "auto":
        return requested
    from tfdist.strategies import detect_strategy

    return detect_strategy().name


def make_strategy(requested: str, **ps_options: Any) -> Any:
    """``tfdist.get_strategy(requested)``; ``ps_options`` go only to strategies with ps tasks."""
    name = strategy_name(requested)
    options = ps_options if strategy_traits(name).has_role("ps") else {}
    return tfdist.get_strategy(name, **options)


def shuffled_batches(x: Any, y: Any, global_batch: int, seed: int) -> Any:
    """A ``dataset_fn`` for `distribute_dataset`: ``(x, y)`` shuffled once with ``seed``, repeated,
    in whole batches of each replica's share of ``global_batch``."""

    def dataset_fn(context: Any) -> Any:
        import tensorflow as tf

        batch = context.get_per_replica_batch_size(global_batch)
        data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed).repeat()
        return data.batch(batch, drop_remainder=True)

    return dataset_fn


def log(strategy: Any, message: str) -> None:
    """Prints ``message`` on the chief only."""
    if strategy.is_chief:
        print(message, flush=True)


# ----------------------------------------------------------------------- crash hook
def crash_after_epoch() -> int | None:
    """The epoch (1-based) after which to crash, from `CRASH_ENV`; None when unset."""
    value = os.environ.get(CRASH_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{CRASH_ENV} must be a positive epoch number. Received: {value!r}. "
                         f"Fix: set it to e.g. 2, or unset it")
    return int(value)


def maybe_crash(epochs_done: int) -> None:
    """Exits with `CRASH_EXIT_STATUS` if `CRASH_ENV` asks to crash after ``epochs_done`` epochs."""
    if crash_after_epoch() == epochs_done:
        print(f"{CRASH_ENV}={epochs_done}: crashing on purpose", flush=True)
        os._exit(CRASH_EXIT_STATUS)


def crash_callback(keras: Any) -> Any:
    """A callback calling `maybe_crash` at each epoch's end; put it after ``BackupAndRestore``."""
    return keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs=None: maybe_crash(epoch + 1))


def checkpoint_callback(keras: Any, strategy: Any, model_dir: str) -> Any:
    """Saves ``Checkpoint(model, epoch)`` to ``<model_dir>/checkpoints/ckpt-<epoch>`` each epoch.

    Runs on every process that runs ``fit`` (a collective under MultiWorkerMirrored); the
    strategy writes it once, on the chief.
    """
    import tensorflow as tf

    epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")  # outside any scope
    directory = os.path.join(model_dir, CHECKPOINT_DIR)
    checkpoint: list[Any] = []  # made at the first epoch's end, once fit has set the model

    def save(done: int, logs: Any = None) -> None:
        if not checkpoint:
            checkpoint.append(tf.train.Checkpoint(model=callback.model, epoch=epoch))
        epoch.assign(done + 1)
        strategy.save_checkpoint(checkpoint[0], directory, checkpoint_number=done + 1)

    callback = keras.callbacks.LambdaCallback(on_epoch_end=save)
    return callback


def fit_callbacks(keras: Any, strategy: Any, model_dir: str) -> list[Any]:
    """The strategy's callbacks with the chief's TensorBoard writer (``<model_dir>/tensorboard``),
    the backup, the per-epoch checkpoint, the crash hook (in order)."""
    return [*strategy.callbacks(tensorboard=os.path.join(model_dir, TENSORBOARD_DIR)),
            strategy.backup_callback(os.path.join(model_dir, "backup")),
            checkpoint_callback(keras, strategy, model_dir), crash_callback(keras)]


# ----------------------------------------------------------------------- evaluator
def evaluate_checkpoints(args: argparse.Namespace, model: Any, evaluate_fn: Any,
                         metric: str, example: str) -> dict[str, Any]:
    """The evaluator task's whole job: evaluate the chief's checkpoints, report, train nothing.

    ``evaluate_fn(model) -> {metric: value, ...}``; ``metric`` names the one the summary shows.
    """
    from tfdist.evaluator import run_sidecar_evaluator

    results = run_sidecar_evaluator(
        model, os.path.join(args.model_dir, CHECKPOINT_DIR), evaluate_fn,
        final_epoch=args.epochs, timeout_seconds=args.evaluator_timeout,
        results_path=os.path.join(args.model_dir, EVAL_RESULTS))
    summary = {
        "role": "evaluator",
        "example": example,
        "keras": flavour.keras_flavour(),
        "evaluations": len(results),
        "epochs_evaluated": [r.epoch for r in results],
        "final_epoch": results[-1].epoch,
        "final_metric": results[-1].metrics[metric],
        "metric": metric,
    }
    print(json.dumps(summary), flush=True)
    tfdist.testing.report(summary)
    return summary


# ------------------------------------------------------------------------- summary
def history_fields(history: Any, steps_per_epoch: int, global_batch: int,
                   seconds: float) -> dict[str, Any]:
    """Epoch bookkeeping of a ``fit`` history: which epochs ran, final loss, throughput."""
    epochs_run = list(history.epoch)
    losses = history.history.get("loss", [])
    return {
        "epochs_run": len(epochs_run),
        "first_epoch": epochs_run[0] + 1 if epochs_run else None,
        "final_loss": float(losses[-1]) if losses else None,
        "samples_per_second": len(epochs_run) * steps_per_epoch * global_batch / seconds,
        "seconds": seconds,
    }


def finish(strategy: Any, summary: dict[str, Any]) -> dict[str, Any]:
    """Adds what every summary has, prints it as one JSON line on the chief, and reports it."""
    summary = {
        "strategy": strategy.name,
        "replicas": strategy.num_replicas,
        "workers": strategy.num_workers,
        "keras": flavour.keras_flavour(),
        **summary,
    }
    if strategy.is_chief:
        print(json.dumps(summary), flush=True)
    tfdist.testing.report(summary)
    return summary
