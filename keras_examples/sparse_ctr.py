"""Click-through prediction with model.fit: large embedding tables, sharded over parameter servers.

Generated data with a learnable signal: three categorical features (user, item, advertiser) with
vocabularies of 50,000, 20,000 and 5,000 ids (75,000 embedding rows in all), drawn from a skewed
(Zipf-like) distribution so that frequent ids are seen often; every id has a hidden weight, and
a click happens with probability ``sigmoid(bias + sum of the hidden weights of the row's ids +
w . dense)``. The model embeds each feature, concatenates the embeddings with two dense features,
and applies two dense layers. The metric is the held-out AUC (0.5 is chance); the summary also
reports ``oracle_auc``, the AUC of the true click probabilities, the best any model can do.

::

    python keras_examples/sparse_ctr.py
    tfdist-launch --ps 2 --workers 2 keras_examples/sparse_ctr.py      # tables split over 2 ps
    tfdist-launch --workers 2 keras_examples/sparse_ctr.py             # multi_worker
    tfdist-launch --strategy horovod --workers 2 keras_examples/sparse_ctr.py

Under ParameterServer with tf-keras every variable is cut into ``--num-shards`` pieces along its
first axis (default: one per ps task), placed round-robin on the ps tasks; with Keras 3, which
cannot shard variables, whole tables are placed round-robin. The summary's ``embedding_shards``
lists the device of each shard of the largest table. Backups, the final model and the JSON summary
work as in ``image_classifier.py``, and so does the evaluator task (``--evaluator``): it reports
the held-out AUC of each epoch's checkpoint.
"""

from __future__ import annotations

import os
import time

import common
import numpy as np

import tfdist.cluster
import tfdist.evaluator
from tfdist import training
from tfdist.core import flavour

SEED = 4321
VOCABS = {"user": 50_000, "item": 20_000, "advertiser": 5_000}
DENSE_FEATURES = 2


def parse_args(argv: list[str] | None = None):
    parser = common.base_parser(__doc__.splitlines()[0], epochs=2, batch_size=256,
                                learning_rate=2e-3, model_dir="runs/sparse_ctr")
    parser.add_argument("--train-samples", type=int, default=100_000, help="default 100000")
    parser.add_argument("--test-samples", type=int, default=20_000, help="default 20000")
    parser.add_argument("--embedding-dim", type=int, default=8, help="default 8")
    parser.add_argument("--num-shards", type=int, default=None,
                        help="ParameterServer with tf-keras only: shards per variable (default: "
                        "the number of ps tasks in TF_CONFIG)")
    return parser.parse_args(argv)


def generate(samples: int, seed: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """(features, clicks, true click probabilities) for ``samples`` rows.

    The hidden weights come from `SEED` (the same for train and test); the rows from ``seed``.
    """
    truth = np.random.default_rng(SEED)
    hidden = {name: truth.normal(0.0, 1.0, size) for name, size in VOCABS.items()}
    dense_weights = truth.normal(0.0, 0.5, DENSE_FEATURES)
    rng = np.random.default_rng(seed)
    features: dict[str, np.ndarray] = {}
    logit = np.full(samples, -1.0)
    for name, size in VOCABS.items():
        ids = np.minimum((size * rng.random(samples) ** 3).astype("int64"), size - 1)  # skewed
        features[name] = ids
        logit += hidden[name][ids]
    dense = rng.normal(0.0, 1.0, (samples, DENSE_FEATURES)).astype("float32")
    features["dense_features"] = dense
    probability = 1.0 / (1.0 + np.exp(-(logit + dense @ dense_weights)))
    clicks = (rng.random(samples) < probability).astype("float32")
    return features, clicks, probability


def build_model(keras, embedding_dim: int, learning_rate: float):
    inputs = {name: keras.Input((), dtype="int64", name=name) for name in VOCABS}
    inputs["dense_features"] = keras.Input((DENSE_FEATURES,), name="dense_features")
    embedded = [keras.layers.Embedding(size, embedding_dim, name=f"{name}_embedding")(inputs[name])
                for name, size in VOCABS.items()]
    x = keras.layers.Concatenate()([*embedded, inputs["dense_features"]])
    x = keras.layers.Dense(64, activation="relu")(x)
    x = keras.layers.Dense(32, activation="relu")(x)
    model = keras.Model(inputs, keras.layers.Dense(1, name="click_logit")(x))
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=[keras.metrics.AUC(from_logits=True, name="auc")],
    )
    return model


def shard_devices(model) -> list[str]:
    """The device of each piece of the largest embedding table (one entry if it is whole)."""
    layer = model.get_layer(f"{max(VOCABS, key=VOCABS.get)}_embedding")
    table = layer.embeddings
    pieces = getattr(table, "variables", None)
    if not isinstance(pieces, (list, tuple)):  # not a ShardedVariable
        pieces = [training.tf_variable(table)]
    return [piece.device for piece in pieces]


def predict_logits(model, features: dict[str, np.ndarray], batch: int = 4096) -> np.ndarray:
    """Logits for every row, computed in this process (the coordinator under ParameterServer)."""
    rows = len(features["dense_features"])
    return np.concatenate([
        np.asarray(model({k: v[i:i + batch] for k, v in features.items()}, training=False))
        for i in range(0, rows, batch)]).reshape(-1)


def ps_count() -> int:
    view = tfdist.cluster.peek_tf_config()
    return view.count("ps") if view else 0


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    import tensorflow as tf
    from sklearn.metrics import roc_auc_score

    keras = flavour.get_keras()
    keras.utils.set_random_seed(SEED)
    x_test, y_test, p_test = generate(args.test_samples, seed=2)
    if tfdist.evaluator.is_evaluator():
        model = build_model(keras, args.embedding_dim, args.learning_rate)
        return common.evaluate_checkpoints(
            args, model, lambda m: {"auc": float(roc_auc_score(y_test, predict_logits(m, x_test)))},
            "auc", "sparse_ctr")
    # Keras 3 cannot shard variables (tfdist.strategies.parameter_server.check_partitioner):
    # whole tables, round-robin.
    shards = ps_count() if flavour.keras_flavour() == "tf_keras" else None
    strategy = common.make_strategy(args.strategy, num_shards=args.num_shards or shards or None)
    common.log(strategy, strategy.describe())
    x_train, y_train, _ = generate(args.train_samples, seed=1)
    global_batch = strategy.global_batch_size(args.per_replica_batch_size)
    steps_per_epoch = max(1, args.train_samples // global_batch)

    def dataset_fn(context):
        batch = context.get_per_replica_batch_size(global_batch)
        data = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        data = data.shuffle(min(len(y_train), 50_000), seed=SEED).repeat()
        return data.batch(batch, drop_remainder=True).prefetch(2)

    with strategy.scope():
        model = build_model(keras, args.embedding_dim,
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
    test_auc = float(roc_auc_score(y_test, predict_logits(model, x_test)))
    saved = strategy.save_model(model, os.path.join(args.model_dir, common.MODEL_FILE))
    return common.finish(strategy, {
        "example": "sparse_ctr",
        "epochs": args.epochs,
        **common.history_fields(history, steps_per_epoch, global_batch, seconds),
        "test_auc": test_auc,
        "oracle_auc": float(roc_auc_score(y_test, p_test)),
        "embedding_rows": sum(VOCABS.values()),
        "embedding_shards": shard_devices(model),
        "model_path": saved,
    })


if __name__ == "__main__":
    main()
