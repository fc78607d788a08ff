"""A training script written the way Horovod's ``examples/tensorflow2`` are, for both Kerases.

Run unchanged through ``tfdist-launch --strategy horovod`` by ``launch/horovod_examples.py``
(whose shim serves ``mnist.npz`` and writes each rank's weights at exit). Like Horovod's
examples it uses only Horovod's API: ``hvd.init``, ``hvd.DistributedOptimizer`` with the
broadcast and metric-average callbacks in ``fit``, then a custom loop with
``hvd.DistributedGradientTape`` and ``hvd.broadcast_variables`` after the first step. Unlike
them it has no Keras-2-only line, and each rank trains on its own shard.

``--sabotage`` drops Horovod's optimizer and tape (the broadcasts stay): the ranks then drift
apart, which shows that the harness's identical-weights check can fail.
"""

import sys

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import tensorflow as tf

SABOTAGE = "--sabotage" in sys.argv[1:]


def mnist_dataset() -> tf.data.Dataset:
    (images, labels), _ = tf.keras.datasets.mnist.load_data(path=f"mnist-{hvd.rank()}.npz")
    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(images[..., tf.newaxis] / 255.0, tf.float32), tf.cast(labels, tf.int64)))
    return dataset.shard(hvd.size(), hvd.rank()).repeat().batch(32)


def build_model() -> tf.keras.Model:
    return tf.keras.Sequential([
        tf.keras.layers.Conv2D(8, [3, 3], activation="relu"),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])


def train_with_fit(dataset: tf.data.Dataset) -> None:
    model = build_model()
    opt = tf.optimizers.Adam(0.001 * hvd.size())
    if not SABOTAGE:
        opt = hvd.DistributedOptimizer(opt)
    model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt,
                  metrics=["accuracy"])
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback()]
    model.fit(dataset, steps_per_epoch=3, epochs=2, callbacks=callbacks,
              verbose=1 if hvd.rank() == 0 else 0)


def train_with_tape(dataset: tf.data.Dataset) -> None:
    model = build_model()
    loss = tf.losses.SparseCategoricalCrossentropy()
    opt = tf.optimizers.SGD(0.1)

    @tf.function
    def training_step(images: tf.Tensor, labels: tf.Tensor, first_batch: bool) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss_value = loss(labels, model(images, training=True))
        if not SABOTAGE:
            tape = hvd_tf.DistributedGradientTape(tape)
        grads = tape.gradient(loss_value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        if first_batch:
            hvd_tf.broadcast_variables(model.variables, root_rank=0)
            variables = opt.variables() if callable(opt.variables) else opt.variables
            hvd_tf.broadcast_variables(variables, root_rank=0)
        return loss_value

    for batch, (images, labels) in enumerate(dataset.take(6)):
        loss_value = training_step(images, labels, batch == 0)
        if hvd.rank() == 0:
            print(f"Step #{batch}\tLoss: {float(loss_value):.6f}")


if __name__ == "__main__":
    hvd.init()
    data = mnist_dataset()
    train_with_fit(data)
    train_with_tape(data)
