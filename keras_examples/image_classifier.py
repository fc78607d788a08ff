"""Image classifier with model.fit: a small CNN on scikit-learn's bundled 8x8 digits (or your .npz).

Runs unchanged on one process and under every tfdist strategy, with Keras 3 or tf-keras
(``TF_USE_LEGACY_KERAS=1``)::

    python keras_examples/image_classifier.py
    tfdist-launch --strategy mirrored keras_examples/image_classifier.py
    tfdist-launch --workers 2 keras_examples/image_classifier.py              # multi_worker
    tfdist-launch --ps 1 --workers 2 keras_examples/image_classifier.py       # parameter_server
    tfdist-launch --strategy horovod --workers 2 keras_examples/image_classifier.py

The digits need no download (1,797 images, 10 classes); 20% are held out for the accuracy that the
summary reports (97-99% after the default 8 epochs under every strategy). ``--data-dir``
trains on your own images instead: a ``.npz`` file (or a directory holding one) with ``x_train``,
``y_train``, ``x_test``, ``y_test`` (images ``(N, H, W)`` or ``(N, H, W, C)``, integer labels).

Training resumes from ``<model-dir>/backup`` after a crash (``BackupAndRestore``); the chief
alone writes the final model to ``<model-dir>/model.keras``, prints progress, and ends with one
JSON line: strategy, replicas, epochs, final loss and held-out accuracy, samples per second, and
where the model went. Training goes through ``tfdist.fit``, which is ``model.fit`` except for
Keras 3 under ParameterServer, where it drives the ClusterCoordinator itself. Under
ParameterServer the chief (coordinator) runs this script: ``fit`` takes the strategy's per-worker
input and ``steps_per_epoch``, and the held-out set is evaluated there.

Each epoch also leaves a checkpoint in ``<model-dir>/checkpoints``. With ``tfdist-launch
--evaluator`` the evaluator task runs this script too, but trains nothing: it reports the held-out
accuracy of each checkpoint as it appears (see ``common.evaluate_checkpoints``).
"""

from __future__ import annotations

import glob
import os
import time

import common
import numpy as np

import tfdist.evaluator
from tfdist.core import flavour

SEED = 1234


def parse_args(argv: list[str] | None = None):
    parser = common.base_parser(__doc__.splitlines()[0], epochs=8, batch_size=32,
                                learning_rate=2e-3, model_dir="runs/image_classifier")
    parser.add_argument("--data-dir", help="a .npz file, or a directory with one, holding "
                        "x_train, y_train, x_test, y_test (default: scikit-learn's digits)")
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


def load_npz(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The user's data, images scaled to [0, 1] (by 255 if they exceed 1), with a channel axis."""
    if os.path.isdir(path):
        found = sorted(glob.glob(os.path.join(path, "*.npz")))
        if len(found) != 1:
            raise ValueError(f"--data-dir must hold exactly one .npz file. Received: {path!r} "
                             f"with {len(found)}. Fix: pass the .npz file itself")
        path = found[0]
    with np.load(path) as data:
        missing = {"x_train", "y_train", "x_test", "y_test"} - set(data.files)
        if missing:
            raise ValueError(f"{path} lacks {sorted(missing)}. Received keys: {data.files}. "
                             "Fix: np.savez(path, x_train=..., y_train=..., x_test=..., "
                             "y_test=...)")
        arrays = [data[k] for k in ("x_train", "y_train", "x_test", "y_test")]
    x_train, y_train, x_test, y_test = arrays
    scale = 255.0 if max(x_train.max(), x_test.max()) > 1 else 1.0

    def images(x: np.ndarray) -> np.ndarray:
        x = (x / scale).astype("float32")
        return x[..., None] if x.ndim == 3 else x

    return images(x_train), y_train.astype("int64"), images(x_test), y_test.astype("int64")


def build_model(keras, input_shape: tuple[int, ...], classes: int, learning_rate: float):
    layers = [keras.Input(input_shape),
              keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
              keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
              keras.layers.MaxPooling2D()]
    if input_shape[0] >= 16:  # larger images: one more stage before the dense head
        layers += [keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
                   keras.layers.MaxPooling2D()]
    model = keras.Sequential([*layers, keras.layers.Flatten(),
                              keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(classes)])
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def held_out_accuracy(model, x_test: np.ndarray, y_test: np.ndarray) -> float:
    """Accuracy on the held-out set, computed here (on the coordinator under ParameterServer)."""
    logits = np.concatenate([np.asarray(model(x_test[i:i + 512], training=False))
                             for i in range(0, len(x_test), 512)])
    return float(np.mean(np.argmax(logits, axis=-1) == y_test))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    keras = flavour.get_keras()
    keras.utils.set_random_seed(SEED)
    data = load_npz(args.data_dir) if args.data_dir else load_digits()
    x_train, y_train, x_test, y_test = data
    classes = int(max(y_train.max(), y_test.max())) + 1
    if tfdist.evaluator.is_evaluator():
        model = build_model(keras, x_train.shape[1:], classes, args.learning_rate)
        return common.evaluate_checkpoints(
            args, model, lambda m: {"accuracy": held_out_accuracy(m, x_test, y_test)},
            "accuracy", "image_classifier")
    strategy = common.make_strategy(args.strategy)
    common.log(strategy, strategy.describe())
    global_batch = strategy.global_batch_size(args.per_replica_batch_size)
    steps_per_epoch = max(1, len(x_train) // global_batch)

    dataset_fn = common.shuffled_batches(x_train, y_train, global_batch, SEED)
    with strategy.scope():
        model = build_model(keras, x_train.shape[1:], classes,
                            strategy.scale_learning_rate(args.learning_rate))
    started = time.perf_counter()
    history = tfdist.fit(  # model.fit, or the coordinator loop for Keras 3 + ParameterServer
        model,
        strategy.distribute_dataset(dataset_fn),
        epochs=args.epochs,
        steps_per_epoch=steps_per_epoch,
        callbacks=common.fit_callbacks(keras, strategy, args.model_dir),
        verbose=2 if strategy.is_chief else 0,
    )
    seconds = time.perf_counter() - started
    accuracy = held_out_accuracy(model, x_test, y_test)
    saved = strategy.save_model(model, os.path.join(args.model_dir, common.MODEL_FILE))
    return common.finish(strategy, {
        "example": "image_classifier",
        "epochs": args.epochs,
        **common.history_fields(history, steps_per_epoch, global_batch, seconds),
        "test_accuracy": accuracy,
        "model_path": saved,
    })


if __name__ == "__main__":
    main()
