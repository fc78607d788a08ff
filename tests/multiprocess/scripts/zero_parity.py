"""One process of a ZeRO job (``get_strategy("multi_worker", zero=stage)``, D processes):
trains a small model with two ``Embedding`` layers (sparse gradients; the first split
between the processes, the second owned by one), Adam with decoupled weight decay
(biases excluded) and norm clipping, and sample weights, with ``model.fit``, once per phase in
the same job, and reports what the test checks.

Args: ``steps DIR``. The stage in ``$TFDIST_ZERO`` (as ``tfdist-launch --zero`` writes it) is
made by ``get_strategy("auto")``, the others by ``get_strategy("multi_worker", zero=stage)``.
Phases, each on a fresh model from the same seeded build function:
stages 1, 2 and 3 with ``global_clipnorm``; stage 1 with the all-gather after the update
skipped (sabotage: parity must fail); stage 3 with ``clipnorm`` (each weight's own norm) that
crashes after its first epoch and resumes from its per-process backups. Stage 3's
model is saved whole to ``DIR/zero3.keras`` (every process calls it; the chief writes it).
The chief also trains the same model in one process on the same global batches (Keras's own
``fit``, no strategy) for each optimizer: the references. Each phase reports the trained
weights, the loss per epoch, and the bytes held (model weights with values, the pieces, the
optimizer's slots) against the partition's plan.
"""

from __future__ import annotations

import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import tfdist
from tfdist.strategies.zero import ZeroStrategy
from tfdist.testing import exit_after_report, report

GLOBAL, VOCAB, SEQ, WIDTH, CLASSES, LR = 8, 128, 4, 8, 4, 0.01
SEED = 5
CLIP = {"global_clipnorm": 0.05, "clipnorm": 0.02}


def build():
    keras.utils.set_random_seed(SEED)
    tokens = keras.Input((SEQ,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(VOCAB, WIDTH, name="emb")(tokens)
    x = keras.layers.Flatten(name="flat")(x)
    x = keras.layers.Dense(WIDTH, activation="tanh", name="hidden")(x)
    # a second embedding, after the cut: one process owns none of its rows (and must still
    # take part in gathering its sparse gradient)
    small = keras.layers.Flatten(name="flat_small")(
        keras.layers.Embedding(VOCAB, 2, name="emb_small")(tokens))
    x = keras.layers.Concatenate(name="join")([x, small])
    logits = keras.layers.Dense(CLASSES, name="out")(x)
    return keras.Model(tokens, logits, name="tiny")


def optimizer(clip):
    adam = keras.optimizers.Adam(LR, weight_decay=0.05, **{clip: CLIP[clip]})
    adam.exclude_from_weight_decay(var_names=["bias"])
    return adam


def batches(steps):
    rng = np.random.default_rng(7)
    x = rng.integers(0, VOCAB, (steps * GLOBAL, SEQ)).astype("int32")
    y = rng.integers(0, CLASSES, (steps * GLOBAL,)).astype("int32")
    weights = rng.uniform(0.2, 2.0, (steps * GLOBAL,)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y, weights)).batch(GLOBAL)


def compile_and_fit(model, clip, steps, callbacks=()):
    model.compile(optimizer=optimizer(clip),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(batches(steps), epochs=2, shuffle=False, verbose=0,
                        callbacks=list(callbacks))
    return history.history["loss"]


class Crash(keras.callbacks.Callback):
    """Fails as the second epoch begins (after the first epoch's backup), on every process."""

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            raise RuntimeError("crash for the test")


def resumed(stage, clip, steps, folder):
    """Trains one epoch with per-process backups and crashes; a fresh model then resumes from
    the backups and trains the second epoch."""
    strategy = tfdist.get_strategy("multi_worker", zero=stage)
    backups = f"{folder}/backups"
    try:
        compile_and_fit(strategy.build_model(build), clip, steps,
                        [strategy.backup_callback(backups), Crash()])
    except RuntimeError as error:
        assert "crash for the test" in str(error)
    model = strategy.build_model(build)
    loss = compile_and_fit(model, clip, steps, [strategy.backup_callback(backups)])
    model.zero_engine.materialize()
    return {"weights": [w.tolist() for w in model.get_weights()], "loss": loss}


def reference(clip, steps):
    model = build()
    loss = compile_and_fit(model, clip, steps)
    slots = sum(int(v.numpy().nbytes) for v in model.optimizer.variables)
    return {"weights": [w.tolist() for w in model.get_weights()], "loss": loss,
            "slots": slots, "optimizer": [v.numpy().tolist() for v in model.optimizer.variables]}


def phase(stage, clip, steps, sabotage=None, save=None):
    if sabotage:  # a test-only option of the class get_strategy makes
        strategy = ZeroStrategy(stage, sabotage=sabotage)
    elif stage == int(os.environ.get("TFDIST_ZERO", 0)):  # as tfdist-launch --zero leaves it
        strategy = tfdist.get_strategy("auto")
    else:
        strategy = tfdist.get_strategy("multi_worker", zero=stage)
    model = strategy.build_model(build)
    engine = model.zero_engine
    held_before = engine.held_bytes()
    start = time.perf_counter()
    loss = compile_and_fit(model, clip, steps)
    seconds = time.perf_counter() - start
    held = engine.held_bytes()
    result = {"class": type(strategy).__name__, "loss": loss, "held_before": held_before,
              "held": held, "seconds": seconds,
              "owned": engine.plan.owned_bytes(), "total": engine.plan.total_bytes,
              "largest": engine.plan.largest_variable_bytes(),
              "pieces": [[p.variable, p.start, p.stop, p.owner] for p in engine.plan.pieces],
              "describe": strategy.describe(),
              "units": None if engine.units is None else len(engine.units)}
    if save:
        result["saved"] = strategy.save_model(model, save)
    if stage == 3:
        engine.materialize()
    result["weights"] = [w.tolist() for w in model.get_weights()]
    return result


def main():
    steps, folder = int(sys.argv[1]), sys.argv[2]
    phases = {"zero1": phase(1, "global_clipnorm", steps),
              "zero2": phase(2, "global_clipnorm", steps),
              "zero3": phase(3, "global_clipnorm", steps, save=f"{folder}/zero3.keras"),
              "sabotage": phase(1, "global_clipnorm", steps, sabotage="skip_gather"),
              "zero3_resumed_clipnorm": resumed(3, "clipnorm", steps, folder)}
    result = {"phases": phases, "initial": [w.tolist() for w in build().get_weights()]}
    if phases["zero1"]["describe"].endswith("chief") or "process 0 " in \
            phases["zero1"]["describe"]:
        result["reference"] = {clip: reference(clip, steps) for clip in CLIP}
        loaded = keras.models.load_model(f"{folder}/zero3.keras")
        result["loaded"] = [w.tolist() for w in loaded.get_weights()]
        result["loaded_optimizer"] = [v.numpy().tolist() for v in loaded.optimizer.variables]
    report(result)
    exit_after_report()


if __name__ == "__main__":
    main()
