"""A first script, written the way the guide teaches: a small MLP on scikit-learn's digits.

The same file runs alone and, unchanged, under every strategy::

    python keras_examples/first_script.py
    tfdist-launch --strategy mirrored keras_examples/first_script.py
    tfdist-launch --workers 2 keras_examples/first_script.py                  # multi_worker
    tfdist-launch --ps 1 --workers 2 keras_examples/first_script.py           # parameter_server
    tfdist-launch --strategy horovod --workers 2 keras_examples/first_script.py
    tfdist-launch --strategy pipeline --stages 2 --workers 2 keras_examples/first_script.py
    tfdist-launch --strategy tensor --tensor 2 --workers 2 keras_examples/first_script.py

Every process that runs it prints the same held-out loss and accuracy (``evaluate``) and the
accuracy of ``predict``'s rows, the whole model's on the whole held-out set, as one process would
(docs/guide/training-script.md says what each strategy does with these calls).
"""

import json
import sys

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import tfdist
import tfdist.testing

keras = tfdist.get_keras()               # tf-keras or Keras 3, whichever this process uses
strategy = tfdist.get_strategy("auto")   # what the launcher asked for; "default" alone
keras.utils.set_random_seed(0)           # the same initial weights in every process

x, y = load_digits(return_X_y=True)      # 1,797 8x8 images, flattened; 10 classes
x = (x / 16.0).astype("float32")
x_train, y_train, x_test, y_test = x[:1509], y[:1509], x[1509:], y[1509:]  # 288 held out
global_batch = strategy.global_batch_size(per_replica=32)


def dataset_fn(input_context):           # every worker's own shard of the training set
    batch = input_context.get_per_replica_batch_size(global_batch)
    data = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(1509, seed=0)
    return data.repeat().batch(batch, drop_remainder=True)


def build_model():                       # the whole model; pipeline and tensor split it
    return keras.Sequential([keras.Input((64,)),
                             keras.layers.Dense(64, activation="relu", name="up"),
                             keras.layers.Dense(32, activation="relu", name="down"),
                             keras.layers.Dense(10, name="logits")])


with strategy.scope():
    model = strategy.build_model(build_model)   # this process's part of the model
    model.compile(optimizer=keras.optimizers.Adam(strategy.scale_learning_rate(1e-2)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
tfdist.fit(model, strategy.distribute_dataset(dataset_fn), epochs=2,
           steps_per_epoch=len(x_train) // global_batch, verbose=2 if strategy.is_chief else 0)

loss, accuracy = model.evaluate(x_test, y_test, batch_size=32, verbose=0)
logits = model.predict(x_test, batch_size=32, verbose=0)
predicted = float(np.mean(np.argmax(logits, axis=-1) == y_test))
result = {"task": tfdist.testing.task_name(), "strategy": strategy.name, "rows": len(logits),
          "loss": float(loss), "accuracy": float(accuracy), "predict_accuracy": predicted}
print(json.dumps(result), flush=True)
tfdist.testing.report(result)           # for the suite; nothing outside it
model_dir = sys.argv[1] if len(sys.argv) > 1 else "runs/first_script"
strategy.save_model(model, f"{model_dir}/model.keras")   # every process; the chief writes it
