"""Rank 0 alone saves a fresh checkpoint and the model inside the strategy's scope.

tf.train.Checkpoint creates its save counter on its first save; if that variable were broadcast
(as variables created under HorovodStrategy's scope are), rank 0 would wait forever for rank 1.
Afterwards both ranks run one collective, which would fail or hang if they were out of step.
``parity.py`` runs `chief_writes` as one of its modes (one launch for several tests).
"""

import sys

import tensorflow as tf

import tfdist
import tfdist.testing
from tfdist.core import flavour


def chief_writes(out_dir: str) -> dict:
    """What this rank wrote (None but on rank 0) and the sum of a collective after it."""
    keras = flavour.get_keras()
    strategy = tfdist.get_strategy("horovod")
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        checkpoint = tf.train.Checkpoint(model=model, step=tf.Variable(5, dtype=tf.int64))
        written = strategy.save_checkpoint(checkpoint, f"{out_dir}/ckpt")
        saved = strategy.save_model(model, f"{out_dir}/model.keras")
    total = strategy.reduce("SUM", tf.constant(1.0), axis=None)
    return {"written": written, "saved": saved, "total": float(total)}


if __name__ == "__main__":
    tfdist.testing.report(chief_writes(sys.argv[1]))
