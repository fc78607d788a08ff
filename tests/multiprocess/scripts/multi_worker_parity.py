"""MultiWorkerMirrored: train on each worker's shard, save, evaluate, predict, report.

Usage: ``python multi_worker_parity.py OUT_DIR``, once per worker with its TF_CONFIG, with
TF_USE_LEGACY_KERAS=1 (tf-keras) or without (Keras 3). Worker ``w`` reads batches ``w, w+2, ...``
of ``per_replica`` rows, so global batch ``k`` is rows ``[2k*B, (2k+2)*B)``, the ``k``-th batch of
the reference. ``evaluate`` and ``predict`` then run on the same sharded input. Last, the chief
alone calls ``evaluate`` once more (``chief_only_evaluate``: the refusal, and how long it took).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import parity_lib
import tensorflow as tf

import tfdist.strategies
import tfdist.strategies.input
from tfdist.core import flavour
from tfdist.errors import StrategyConfigError
from tfdist.testing import report

PER_REPLICA, STEPS = 4, 5
out_dir = sys.argv[1]

keras = flavour.get_keras()
strategy = tfdist.strategies.get_strategy(
    "multi_worker", implementation="ring", timeout_seconds=60, startup_timeout_seconds=60
)
global_batch = strategy.global_batch_size(PER_REPLICA)
x, y = parity_lib.make_data(global_batch * STEPS)
rows = np.arange(len(x), dtype="int64")


def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    batch = ctx.get_per_replica_batch_size(global_batch)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)  # sharded by the helper


def my_rows() -> list[int]:
    """The row ids this worker's shard holds (same helper, same context, ids instead of x)."""
    ids = tfdist.strategies.input.shard_for(
        tf.data.Dataset.from_tensor_slices(rows).batch(PER_REPLICA), strategy.input_context()
    )
    return [int(r) for batch in ids for r in batch.numpy()]


with strategy.scope():
    model = parity_lib.build_model(keras)
initial = model.get_weights()
weights_file = os.path.join(out_dir, "fit.weights.h5")
callbacks = [strategy.checkpoint_callback(weights_file, save_weights_only=True)]
if os.environ.get("TENSORBOARD_DIR"):
    callbacks.append(keras.callbacks.TensorBoard(strategy.write_path(os.environ["TENSORBOARD_DIR"])))
history = model.fit(
    strategy.distribute_dataset(dataset_fn), epochs=1, steps_per_epoch=STEPS, verbose=0,
    callbacks=callbacks,
)
weights = model.get_weights()
evaluated = model.evaluate(strategy.distribute_dataset(dataset_fn), steps=STEPS, verbose=0)
predicted = model.predict(strategy.distribute_dataset(dataset_fn), steps=STEPS, verbose=0)
local = [
    [np.asarray(v).tolist() for v in strategy.experimental_local_results(var)]
    for var in model.weights
]
model_path = strategy.save_model(model, os.path.join(out_dir, "model.keras"))
ckpt_path = strategy.save_checkpoint(
    tf.train.Checkpoint(model=model), os.path.join(out_dir, "ckpt"))
result = {
    "task": str(strategy.task),
    "is_chief": strategy.is_chief,
    "num_workers": strategy.num_workers,
    "worker_index": strategy.worker_index,
    "num_replicas": strategy.num_replicas_in_sync,
    "rows": my_rows(),
    "loss": history.history["loss"],
    "initial": parity_lib.as_lists(initial),
    "weights": parity_lib.as_lists(weights),
    "evaluate": float(np.asarray(evaluated).reshape(-1)[0]),
    "predict": np.asarray(predicted).tolist(),
    "local": local,
    "model_path": model_path,
    "ckpt_path": ckpt_path,
}
if strategy.is_chief:
    checkpointed = parity_lib.build_model(keras)
    checkpointed.load_weights(weights_file)
    result["checkpointed"] = parity_lib.as_lists(checkpointed.get_weights())
    result["reloaded"] = parity_lib.as_lists(keras.models.load_model(model_path).get_weights())
    reference = parity_lib.reference_weights(keras, initial, x, y, global_batch)
    result["reference"] = parity_lib.as_lists(reference)
    trained = parity_lib.build_model(keras)
    trained.set_weights(reference)
    result["reference_evaluate"] = float(
        trained.evaluate(x, y, batch_size=global_batch, verbose=0))
    result["reference_predict"] = trained.predict(x, batch_size=global_batch, verbose=0).tolist()
    result["half_batch"] = parity_lib.as_lists(
        parity_lib.half_batch_weights(keras, initial, x, y, PER_REPLICA))
    # Last, evaluate on the chief alone, the other worker gone on to its end: refused at once
    # (TensorFlow failed it only once the peer's heartbeats had stopped).
    started = time.monotonic()
    try:
        model.evaluate(strategy.distribute_dataset(dataset_fn), steps=STEPS, verbose=0)
        result["chief_only_evaluate"] = "ran"
    except StrategyConfigError as err:
        result["chief_only_evaluate"] = str(err)
    result["chief_only_evaluate_s"] = time.monotonic() - started
report(result)
