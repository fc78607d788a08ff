"""TensorFlow's parameter-server guide, "Training with Model.fit", as a user brings it: no tfdist.

Usage: ``tfdist-launch --ps 2 --workers 2 tf_guide_ps_fit.py WORKING_DIR [datasetcreator]``.
The chief makes its own ``tf.distribute.ParameterServerStrategy`` (the guide's
``MinSizePartitioner``), compiles under its scope (the guide's ``steps_per_execution``), and calls
``model.fit`` with the guide's callbacks (TensorBoard, ModelCheckpoint, BackupAndRestore), plus
``validation_data``, then ``model.evaluate``. Two things differ from the guide because they are
tf-keras only (Keras 3's errors name ``TF_USE_LEGACY_KERAS=1``): ``fit`` gets ``dataset_fn``
itself instead of ``tf.keras.utils.experimental.DatasetCreator(dataset_fn)`` (the
``datasetcreator`` argument uses the guide's line: tf-keras trains with it; Keras 3 fails with
an error that names the fix), and the optimizer
is ``tf.keras.optimizers.SGD`` instead of ``...legacy.SGD``; the checkpoint path ends in
``.keras``, as Keras 3 requires. The data is learnable (``y = x @ w``) so the loss falls.

The test's probe: ``dataset_fn`` writes one empty file per row it reads, named by its input
pipeline (``rows/PIPELINE_ROW``), from inside the worker's tf.data pipeline.
"""

import json
import os
import sys

import tensorflow as tf

NUM_PS, ROWS, FEATURES = 2, 64, 10
working_dir = sys.argv[1]
use_dataset_creator = sys.argv[2:] == ["datasetcreator"]
rows_dir = os.path.join(working_dir, "rows")

cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
variable_partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
    min_shard_bytes=(256 << 10), max_shards=NUM_PS)
strategy = tf.distribute.ParameterServerStrategy(
    cluster_resolver, variable_partitioner=variable_partitioner)


def dataset_fn(input_context):
    global_batch_size = 8
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    pipeline = tf.strings.as_string(tf.cast(input_context.input_pipeline_id, tf.int64))
    true_w = tf.reshape(tf.range(FEATURES, dtype=tf.float32) / FEATURES, (FEATURES, 1))

    def example(row):
        tf.io.write_file(tf.strings.join([rows_dir, "/", pipeline, "_",
                                          tf.strings.as_string(row)]), "")
        x = tf.random.stateless_uniform((FEATURES,), seed=tf.stack([row, 0]))
        return x, tf.matmul(x[None, :], true_w)[0]

    dataset = tf.data.Dataset.range(ROWS)
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    dataset = dataset.map(example).repeat()
    dataset = dataset.batch(batch_size)
    dataset = dataset.prefetch(2)
    return dataset


with strategy.scope():
    model = tf.keras.models.Sequential([tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(1)])
    model.compile(tf.keras.optimizers.SGD(0.1), loss="mse", steps_per_execution=10)

log_dir = os.path.join(working_dir, "log")
ckpt_filepath = os.path.join(working_dir, "ckpt.keras")
backup_dir = os.path.join(working_dir, "backup")
callbacks = [
    tf.keras.callbacks.TensorBoard(log_dir=log_dir),
    tf.keras.callbacks.ModelCheckpoint(filepath=ckpt_filepath),
    tf.keras.callbacks.BackupAndRestore(backup_dir=backup_dir),
]

data = dataset_fn
if use_dataset_creator:  # the guide's own line: tf-keras only
    data = tf.keras.utils.experimental.DatasetCreator(dataset_fn)

history = model.fit(data, epochs=4, steps_per_epoch=20, callbacks=callbacks,
                    validation_data=data, validation_steps=2, verbose=0)
evaluated = model.evaluate(data, steps=4, verbose=0)
with open(os.path.join(working_dir, "chief.json"), "w") as file:
    json.dump({"history": history.history, "evaluate": evaluated, "pid": os.getpid(),
               "devices": sorted({getattr(v, "device", None) or v.value.device  # Keras 3: .value
                                  for v in model.variables}),
               "keras": type(model).__module__.split(".")[0]}, file)
