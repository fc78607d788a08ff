"""Custom training loop: ``strategy.run`` on a distributed dataset, checkpointed every epoch.

The same digits classifier as ``image_classifier.py``, trained without ``model.fit``::

    python keras_examples/custom_loop.py
    tfdist-launch --strategy mirrored keras_examples/custom_loop.py
    tfdist-launch --workers 2 keras_examples/custom_loop.py                 # multi_worker
    tfdist-launch --strategy horovod --workers 2 keras_examples/custom_loop.py

What a distributed custom loop needs, and where it is below:

* the input: ``strategy.distribute_dataset(dataset_fn)`` gives each replica its per-replica
  batch (`common.shuffled_batches`);
* the loss: each replica averages its per-example losses over the **global** batch
  (``tf.nn.compute_average_loss(..., global_batch_size=...)``), so that summing the replicas'
  gradients (what the optimizer does under a strategy) gives the global-batch gradient
  (`make_train_step`);
* the step: ``strategy.run`` inside one ``tf.function``; losses and counts are summed with
  ``strategy.reduce``;
* resuming: a ``tf.train.Checkpoint`` of the model, optimizer and epoch counter, saved by
  ``strategy.save_checkpoint`` (written once, by the chief) after every epoch and restored with
  ``strategy.restore_checkpoint`` at start, so a restarted job continues at the next epoch. The
  evaluator task (``tfdist-launch --evaluator``) evaluates these checkpoints as they appear.

ParameterServer is not supported here: a custom loop there must dispatch each step with
``ClusterCoordinator.schedule``; use ``image_classifier.py`` or ``sparse_ctr.py`` (``model.fit``).
"""

from __future__ import annotations

import os
import time

import common
from image_classifier import SEED, build_model, held_out_accuracy, load_digits

import tfdist.evaluator
import tfdist.strategies
from tfdist.core import flavour

CHECKPOINT_DIR = common.CHECKPOINT_DIR


def parse_args(argv: list[str] | None = None):
    parser = common.base_parser(__doc__.splitlines()[0], epochs=8, batch_size=32,
                                learning_rate=2e-3, model_dir="runs/custom_loop")
    return parser.parse_args(argv)


def refuse_parameter_server(name: str) -> None:
    if tfdist.strategies.strategy_traits(name).server_roles:  # only a coordinator runs this
        raise ValueError(
            f"custom_loop.py does not support strategy {name!r}. Received: "
            f"--strategy {name} (or a TF_CONFIG with ps tasks). A ParameterServer custom "
            "loop must dispatch every step with ClusterCoordinator.schedule. Fix: use "
            "keras_examples/image_classifier.py or sparse_ctr.py (model.fit) for ParameterServer, "
            "or run this script with --strategy default, mirrored, multi_worker or horovod")


def make_train_step(strategy, tf, model, optimizer, global_batch: int):
    """A ``tf.function`` running one step on every replica; returns (loss, correct predictions)."""

    def replica_step(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        correct = tf.reduce_sum(tf.cast(tf.argmax(logits, -1) == labels, tf.float32))
        return loss, correct

    @tf.function
    def train_step(iterator):
        loss, correct = strategy.run(replica_step, args=next(iterator))
        reduce = tf.distribute.ReduceOp.SUM
        return (strategy.reduce(reduce, loss, axis=None),
                strategy.reduce(reduce, correct, axis=None))

    return train_step


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    refuse_parameter_server(common.strategy_name(args.strategy))
    import tensorflow as tf

    keras = flavour.get_keras()
    keras.utils.set_random_seed(SEED)
    x_train, y_train, x_test, y_test = load_digits()
    if tfdist.evaluator.is_evaluator():
        model = build_model(keras, x_train.shape[1:], 10, args.learning_rate)
        return common.evaluate_checkpoints(
            args, model, lambda m: {"accuracy": held_out_accuracy(m, x_test, y_test)},
            "accuracy", "custom_loop")
    strategy = common.make_strategy(args.strategy)
    common.log(strategy, strategy.describe())
    global_batch = strategy.global_batch_size(args.per_replica_batch_size)
    steps_per_epoch = len(x_train) // global_batch

    with strategy.scope():
        model = build_model(keras, x_train.shape[1:], 10,
                            strategy.scale_learning_rate(args.learning_rate))
        optimizer = model.optimizer
        optimizer.build(model.trainable_variables)  # its slots exist before a restore
        epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch)
    checkpoint_dir = os.path.join(args.model_dir, CHECKPOINT_DIR)
    restored = strategy.restore_checkpoint(checkpoint, checkpoint_dir)
    first_epoch = int(epoch.numpy())
    common.log(strategy, f"restored {restored}: resuming after epoch {first_epoch}"
               if restored else "no checkpoint: starting at epoch 1")

    iterator = iter(strategy.distribute_dataset(
        common.shuffled_batches(x_train, y_train, global_batch, SEED)))
    train_step = make_train_step(strategy, tf, model, optimizer, global_batch)
    losses: list[float] = []
    started = time.perf_counter()
    for done in range(first_epoch, args.epochs):
        total_loss = total_correct = 0.0
        for _ in range(steps_per_epoch):
            loss, correct = train_step(iterator)
            total_loss += float(loss)
            total_correct += float(correct)
        losses.append(total_loss / steps_per_epoch)
        common.log(strategy, f"epoch {done + 1}/{args.epochs}: loss {losses[-1]:.4f}, accuracy "
                   f"{total_correct / (steps_per_epoch * global_batch):.4f}")
        epoch.assign(done + 1)
        strategy.save_checkpoint(checkpoint, checkpoint_dir)
        common.maybe_crash(done + 1)
    seconds = time.perf_counter() - started
    saved = strategy.save_model(model, os.path.join(args.model_dir, common.MODEL_FILE))
    return common.finish(strategy, {
        "example": "custom_loop",
        "epochs": args.epochs,
        "epochs_run": len(losses),
        "first_epoch": first_epoch + 1 if losses else None,
        "final_loss": losses[-1] if losses else None,
        "samples_per_second": len(losses) * steps_per_epoch * global_batch / seconds,
        "seconds": seconds,
        "test_accuracy": held_out_accuracy(model, x_test, y_test),
        "checkpoint": restored,
        "model_path": saved,
    })


if __name__ == "__main__":
    main()
