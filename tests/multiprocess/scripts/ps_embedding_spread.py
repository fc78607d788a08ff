"""An embedding table over 2 ps tasks under Keras 3, two ways (no tfdist import).

Usage: ``tfdist-launch --ps 2 --workers 1 ps_embedding_spread.py OUT_JSON MODE``:

* ``MODE=partitioner``: TensorFlow's way, ``FixedShardsPartitioner(2)`` on the strategy, so the
  table is one ShardedVariable in 2 pieces. Keras 3 cannot train it: ``model.fit`` (tfdist's
  coordinator loop) raises, saying why (the tape needs a handle; a ShardedVariable has none).
* ``MODE=split``: no partitioner; the table is 2 ``Embedding`` layers of half the rows each (row
  ``i`` in table ``i % 2`` at ``i // 2``), which ParameterServerStrategy places round-robin, one
  per ps task. Trains with ``model.fit(dataset_fn)``.

Reports bytes of variables per ps task, the losses, and the error (MODE=partitioner).
"""

import json
import sys

import numpy as np
import tensorflow as tf

out, mode = sys.argv[1], sys.argv[2]
VOCAB, DIM = 4096, 32

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
partitioner = (tf.distribute.experimental.partitioners.FixedShardsPartitioner(2)
               if mode == "partitioner" else None)
strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)


class SplitEmbedding(tf.keras.layers.Layer):
    """One logical table of ``VOCAB`` rows kept as ``shards`` tables (row i: table i % shards)."""

    def __init__(self, vocab, dim, shards, **kwargs):
        super().__init__(**kwargs)
        self.shards = shards
        self.tables = [tf.keras.layers.Embedding(-(-vocab // shards), dim, name=f"table_{s}")
                       for s in range(shards)]

    def call(self, ids):
        parts = [table(ids // self.shards) for table in self.tables]
        which = tf.one_hot(ids % self.shards, self.shards, dtype=parts[0].dtype)
        return tf.einsum("...s,s...d->...d", which, tf.stack(parts))


def dataset_fn(input_context):
    ids = tf.data.Dataset.range(VOCAB).shard(input_context.num_input_pipelines,
                                             input_context.input_pipeline_id)
    ids = ids.map(lambda i: i % 256)  # 256 rows trained often enough for the loss to fall
    data = ids.map(lambda i: (tf.reshape(i, (1,)), tf.reshape(tf.cast(i % 7, tf.float32), (1,))))
    return data.shuffle(256, seed=1).repeat().batch(32)


with strategy.scope():
    table = (SplitEmbedding(VOCAB, DIM, 2) if mode == "split"
             else tf.keras.layers.Embedding(VOCAB, DIM))
    model = tf.keras.Sequential([tf.keras.Input((1,), dtype="int64"), table,
                                 tf.keras.layers.Flatten(), tf.keras.layers.Dense(1)])
    model.compile(tf.keras.optimizers.SGD(0.5), loss="mse")


def per_ps_bytes():
    found = {}
    for variable in model.variables:
        inner = getattr(variable, "value", variable)
        for piece in getattr(inner, "variables", [inner]):
            ps = piece.device.split("/task:")[1].split("/")[0]
            found[ps] = found.get(ps, 0) + int(np.prod(piece.shape)) * piece.dtype.size
    return found


result = {"mode": mode, "keras": type(model).__module__.split(".")[0]}
try:
    history = model.fit(dataset_fn, epochs=3, steps_per_epoch=40, verbose=0)
    result["loss"] = history.history["loss"]
except Exception as err:  # noqa: BLE001 - the error is what MODE=partitioner measures
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    result["error"] = f"{type(err).__name__}: {' '.join(lines)[:1500]}"
result["bytes_per_ps"] = per_ps_bytes()
with open(out, "w") as file:
    json.dump(result, file)
