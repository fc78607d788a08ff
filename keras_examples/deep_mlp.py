"""A deep MLP with model.fit, built to be split into pipeline stages (and run under every strategy).

Runs unchanged on one process and under every tfdist strategy::

    python keras_examples/deep_mlp.py
    tfdist-launch --strategy pipeline --stages 2 --workers 2 --micro-batches 4 \\
        keras_examples/deep_mlp.py                                   # 2 stages, 1 replica
    tfdist-launch --stages 2 --workers 4 keras_examples/deep_mlp.py  # 2 replicas x 2 stages
    tfdist-launch --workers 2 keras_examples/deep_mlp.py             # multi_worker
    tfdist-launch --strategy horovod --workers 2 keras_examples/deep_mlp.py

The data is scikit-learn's bundled 8x8 digits, flattened (1,797 images, 10 classes, no download);
20% are held out. The model is ``--depth`` residual-free Dense blocks of ``--width`` units with
LayerNormalization, a chain of layers that `strategy.build_model` can cut anywhere. With
``--norm batch`` the blocks use BatchNormalization instead, whose statistics under a pipeline of
M > 1 micro-batches are each micro-batch's (GPipe's behaviour): the example then opts in with
``batch_norm="per_micro_batch"``, which the pipeline otherwise refuses. Under ``pipeline``
every process builds only its own stage (the build function runs without allocating the whole
model), and the summary reports what each stage holds.

Training resumes from ``<model-dir>/backup`` after a crash; the whole model goes to
``<model-dir>/model.keras`` (under ``pipeline`` the chief gathers the stages' weights). The chief
prints one JSON line: strategy, replicas, final loss, held-out accuracy, samples per second.
"""

from __future__ import annotations

import os
import time

import common
import numpy as np
from image_classifier import SEED, load_digits

import tfdist
from tfdist.core import flavour


def parse_args(argv: list[str] | None = None):
    parser = common.base_parser(__doc__.splitlines()[0], epochs=6, batch_size=64,
                                learning_rate=1e-3, model_dir="runs/deep_mlp")
    parser.add_argument("--width", type=int, default=128, help="units per block (default 128)")
    parser.add_argument("--depth", type=int, default=6, help="Dense blocks (default 6)")
    parser.add_argument("--norm", choices=("layer", "batch"), default="layer",
                        help="LayerNormalization (default) or BatchNormalization in each block")
    return parser.parse_args(argv)


def load_flat_digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """image_classifier's digits split, each 8x8 image flattened to 64 features in [0, 1]."""
    x_train, y_train, x_test, y_test = load_digits()
    return x_train.reshape(len(x_train), -1), y_train, x_test.reshape(len(x_test), -1), y_test


def build_model(keras, features: int, classes: int, width: int, depth: int,
                norm: str = "layer"):
    """The whole model (uncompiled): ``depth`` x (Dense, LayerNormalization or
    BatchNormalization), then the logits."""
    def normalization(name: str):
        if norm == "layer":
            return keras.layers.LayerNormalization(name=name)
        # momentum 0.9: the moving statistics settle within the example's few hundred steps
        return keras.layers.BatchNormalization(momentum=0.9, name=name)

    layers = [keras.Input((features,))]
    for i in range(depth):
        layers += [keras.layers.Dense(width, activation="gelu", name=f"dense_{i}"),
                   normalization(f"norm_{i}")]
    layers.append(keras.layers.Dense(classes, name="logits"))
    return keras.Sequential(layers, name="deep_mlp")


def held_out_accuracy(model, x_test: np.ndarray, y_test: np.ndarray, batch: int) -> float:
    """Accuracy on the held-out set (rows cut to whole batches: a pipeline needs them)."""
    rows = len(x_test) - len(x_test) % batch
    logits = model.predict(x_test[:rows], batch_size=batch, verbose=0)
    return float(np.mean(np.argmax(logits, axis=-1) == y_test[:rows]))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    keras = flavour.get_keras()
    keras.utils.set_random_seed(SEED)
    x_train, y_train, x_test, y_test = load_flat_digits()
    classes = int(y_train.max()) + 1
    name = common.strategy_name(args.strategy)
    if args.norm == "batch" and name == "pipeline":  # the explicit opt-in (else refused at M > 1)
        strategy = tfdist.get_strategy(name, batch_norm="per_micro_batch")
    else:
        strategy = common.make_strategy(name)
    common.log(strategy, strategy.describe())
    global_batch = strategy.global_batch_size(args.per_replica_batch_size)
    steps_per_epoch = max(1, len(x_train) // global_batch)

    dataset_fn = common.shuffled_batches(x_train, y_train, global_batch, SEED)
    model = strategy.build_model(
        lambda: build_model(keras, x_train.shape[1], classes, args.width, args.depth, args.norm))
    with strategy.scope():
        model.compile(optimizer=keras.optimizers.Adam(strategy.scale_learning_rate(
                          args.learning_rate)),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    started = time.perf_counter()
    history = model.fit(
        strategy.distribute_dataset(dataset_fn), epochs=args.epochs,
        steps_per_epoch=steps_per_epoch,
        callbacks=[*strategy.callbacks(
                       tensorboard=os.path.join(args.model_dir, common.TENSORBOARD_DIR)),
                   strategy.backup_callback(os.path.join(args.model_dir, "backup"))],
        verbose=2 if strategy.is_chief else 0,
    )
    seconds = time.perf_counter() - started
    accuracy = held_out_accuracy(model, x_test, y_test, global_batch)
    saved = strategy.save_model(model, os.path.join(args.model_dir, common.MODEL_FILE))
    summary = {
        "example": "deep_mlp", "epochs": args.epochs, "norm": args.norm,
        **common.history_fields(history, steps_per_epoch, global_batch, seconds),
        "test_accuracy": accuracy, "model_path": saved,
    }
    if hasattr(strategy, "stage_report"):
        summary["stage"] = strategy.stage_report()
    return common.finish(strategy, summary)


if __name__ == "__main__":
    main()
