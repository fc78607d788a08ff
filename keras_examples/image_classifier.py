"""Image classifier with model.fit: a small CNN on scikit-learn's bundled 8x8 digits.

Runs unchanged on one process and under every tfdist strategy::

    python keras_examples/image_classifier.py --epochs 3
    tfdist-launch --workers 2 keras_examples/image_classifier.py --epochs 3
    tfdist-launch --strategy horovod --workers 2 keras_examples/image_classifier.py

The digits need no download (1,797 images, 10 classes); 20% are held out for the accuracy that the
summary reports. Prints progress on the chief only and ends with one JSON line: strategy, replicas,
epochs, final loss and held-out accuracy, samples per second, and where the model went.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import tfdist
import tfdist.testing
from tfdist import compat

SEED = 1234


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default=os.environ.get("TFDIST_STRATEGY", "auto"),
                        help="tfdist strategy name (default: auto, or TFDIST_STRATEGY)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--per-replica-batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=2e-3,
                        help="for one replica; scaled linearly by the number of replicas")
    parser.add_argument("--model-dir", default="runs/image_classifier")
    return parser.parse_args(argv)


def load_digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): 8x8x1 float32 images in [0, 1], int labels."""
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    images = (digits.images / 16.0).astype("float32")[..., None]
    labels = digits.target.astype("int64")
    order = np.random.default_rng(SEED).permutation(len(labels))
    split = int(0.8 * len(labels))
    train, test = order[:split], order[split:]
    return images[train], labels[train], images[test], labels[test]


def build_model(keras, learning_rate: float):
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    import tensorflow as tf

    keras = compat.get_keras()
    keras.utils.set_random_seed(SEED)
    strategy = tfdist.get_strategy(args.strategy)
    x_train, y_train, x_test, y_test = load_digits()
    global_batch = strategy.global_batch_size(args.per_replica_batch_size)
    steps_per_epoch = len(x_train) // global_batch

    def dataset_fn(context):
        batch = context.get_per_replica_batch_size(global_batch)
        data = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        return data.shuffle(len(x_train), seed=SEED).repeat().batch(batch, drop_remainder=True)

    with strategy.scope():
        model = build_model(keras, strategy.scale_learning_rate(args.learning_rate))
    callbacks = [
        *strategy.callbacks(),
        keras.callbacks.BackupAndRestore(os.path.join(args.model_dir, "backup")),
    ]
    started = time.perf_counter()
    history = model.fit(
        strategy.distribute_dataset(dataset_fn),
        epochs=args.epochs,
        steps_per_epoch=steps_per_epoch,
        callbacks=callbacks,
        verbose=2 if strategy.is_chief else 0,
    )
    seconds = time.perf_counter() - started
    logits = model(x_test, training=False)
    accuracy = float(np.mean(np.argmax(np.asarray(logits), axis=-1) == y_test))
    saved = strategy.save_model(model, os.path.join(args.model_dir, "model.keras"))
    epochs_run = len(history.history.get("loss", []))
    summary = {
        "example": "image_classifier",
        "strategy": strategy.name,
        "replicas": strategy.num_replicas,
        "workers": strategy.num_workers,
        "epochs": args.epochs,
        "epochs_run": epochs_run,
        "final_loss": float(history.history["loss"][-1]) if epochs_run else None,
        "test_accuracy": accuracy,
        "samples_per_second": epochs_run * steps_per_epoch * global_batch / seconds,
        "model_path": saved,
    }
    if strategy.is_chief:
        print(json.dumps(summary), flush=True)
    tfdist.testing.report(summary)
    return summary


if __name__ == "__main__":
    main()
