"""One process of a D=2 x K=2 pipeline job, or a D=2 x T=2 tensor job, with ZeRO on its data
axis (4 processes): trains an Embedding model (pipeline stage 0: the embedding, its gradient
row slices; stage 1: the dense layers; tensor: each layer split over 2 shards) with Adam,
``global_clipnorm`` (a norm over every stage or shard and every part) and sample weights, once
per phase in the same job, and reports what the test checks.

Args: ``steps DIR``. The strategy (``$TFDIST_STRATEGY``: pipeline or tensor) is
``get_strategy("auto")`` under ``TFDIST_ZERO=1`` (as
``tfdist-launch --zero 1`` writes it); each phase sets ``strategy.zero`` before building its
model (one strategy per process: the collectives join once). Phases, each on a fresh copy of
the same initial weights: ``zero1``; ``zero2``, whose model is then saved whole to
``DIR/zero2.keras`` (every process calls it; the chief writes it); ``zero1_clipnorm``: Adam
with ``clipnorm`` (each whole weight's norm, over its parts and shards) and weight decay, the
biases excluded (the exclusion must reach the parts); ``sabotage``: stage 2 with the
all-gather after the update skipped (``TFDIST_ZERO_SABOTAGE=skip_gather``): parity must
fail. The chief also trains the whole model in one process with Keras's own ``fit`` on the same
global batches: the reference. Each phase reports the gathered weights (chief), the loss per
epoch, the bytes of the optimizer's variables this process holds and those of the same Adam
built on the whole stage (what the replicated pipeline holds). ``zero3`` also keeps a
per-process backup and trains on for an epoch; last, ``zero3_resume`` (`run_resume`) resumes a
fresh model from that backup for the same epoch.
"""

from __future__ import annotations

import os
import sys
import time

import keras
import numpy as np

import tfdist
from tfdist.testing import report
from tfdist.zero.data_axis import SKIP_GATHER_ENV

GLOBAL, SEQ, VOCAB, DIM, LR, CLIP = 16, 6, 16, 4, 0.05, 0.05
PHASES = (("zero1", 1, "global_clipnorm"), ("zero2", 2, "global_clipnorm"),
          ("zero1_clipnorm", 1, "clipnorm"), ("sabotage", 2, "global_clipnorm"))
STAGE3_PHASES = (("zero3", 3, "global_clipnorm"), ("zero3_clipnorm", 3, "clipnorm"),
                 ("sabotage3", 3, "global_clipnorm"))
"""The same job goes on with them after stages 1-2."""
SABOTAGE = {"sabotage": "skip_gather", "sabotage3": "skip_scatter"}


def build():
    return keras.Sequential([
        keras.Input((SEQ,), dtype="int32"),
        keras.layers.Embedding(VOCAB, DIM, name="emb"),
        keras.layers.Flatten(name="flat"),
        keras.layers.Dense(8, activation="tanh", name="d0"),
        keras.layers.Dense(1, name="out"),
    ], name="embedding_mlp")


def data(steps):
    rng = np.random.default_rng(5)
    x = rng.integers(0, VOCAB, size=(steps * GLOBAL, SEQ)).astype("int32")
    y = (np.sin(x[:, :1]) + 0.1 * x[:, 1:2]).astype("float32")
    weight = rng.uniform(0.2, 2.0, size=(steps * GLOBAL,)).astype("float32")
    return x, y, weight


def optimizer(clip="global_clipnorm"):
    """Adam with ``global_clipnorm``; or with ``clipnorm`` (each whole weight's norm) and
    decoupled weight decay, the biases excluded by name."""
    if clip == "global_clipnorm":
        return keras.optimizers.Adam(LR, global_clipnorm=CLIP)
    adam = keras.optimizers.Adam(LR, clipnorm=CLIP / 4, weight_decay=0.5)
    adam.exclude_from_weight_decay(var_names=["bias"])
    return adam


def slot_bytes(adam):
    return sum(int(v.numpy().nbytes) for v in adam.variables)


def fit_reference(initial, x, y, weight, clip):
    model = build()
    model.set_weights(initial)
    model.compile(optimizer=optimizer(clip), loss="mse")
    # the optimizer's variables made now, not in the first traced step, which tf.function would
    # then trace twice (0.3-1 CPU-s a fit): the same numbers, measured gap 0
    model.optimizer.build(model.trainable_variables)
    history = model.fit(x, y, sample_weight=weight, batch_size=GLOBAL, epochs=1,
                        shuffle=False, verbose=0)
    return [w.tolist() for w in model.get_weights()], history.history["loss"]


def run_phase(strategy, name, stage, initial, x, y, weight, folder, clip):
    strategy.zero = stage
    if name in SABOTAGE:
        os.environ[SKIP_GATHER_ENV] = SABOTAGE[name]
    whole = build()
    whole.set_weights(initial)
    model = strategy.build_model(whole)
    model.compile(optimizer=optimizer(clip), loss="mse")
    backup = [strategy.backup_callback(os.path.join(folder, "backup3"),
                                       delete_checkpoint=False)] if name == "zero3" else []
    start = time.process_time()
    loss = model.fit(x, y, sample_weight=weight, batch_size=GLOBAL, epochs=1, shuffle=False,
                     verbose=0, callbacks=backup).history["loss"]
    result = {"loss": loss, "cpu_seconds": time.process_time() - start,
              "slots": slot_bytes(model.optimizer)}
    whole_adam = optimizer()
    shapes = [keras.Variable(np.zeros(v.shape, "float32")) for v in model.trainable_variables]
    whole_adam.build(shapes)
    result["replicated_slots"] = slot_bytes(whole_adam)
    result["stage_bytes"] = sum(int(v.numpy().nbytes) for v in shapes)
    if stage == 3:  # what the stage model and this process's parts hold between steps
        zero = getattr(model, "_pipeline_zero", None) or model.zero  # pipeline, tensor
        result["held"] = zero.held_bytes(model.optimizer)
        if name == "zero3":
            result["evaluated"] = model.evaluate(x, y, sample_weight=weight, batch_size=GLOBAL,
                                                 verbose=0)
    result["weights"] = gathered_weights(strategy, model)
    if name in ("zero2", "zero3"):
        path = os.path.join(folder, f"{name}.keras")
        result["saved"] = strategy.save_model(model, path)
        if strategy.is_chief:
            result["loaded"] = [w.tolist() for w in keras.models.load_model(path).get_weights()]
    if name == "zero3":  # its backup's state; then one more epoch, uninterrupted
        result["backup"] = held_state(model)
        model.fit(x, y, sample_weight=weight, batch_size=GLOBAL, epochs=1, shuffle=False,
                  verbose=0)
        result["trained_on"] = gathered_weights(strategy, model)
    os.environ.pop(SKIP_GATHER_ENV, None)
    return result


def held_state(model):
    """This process's pieces and optimizer variables (stage 3), as lists."""
    zero = getattr(model, "_pipeline_zero", None) or model.zero  # pipeline, tensor
    return {"pieces": [np.asarray(p.numpy()).tolist() for p in zero.pieces],
            "slots": [np.asarray(v.numpy()).tolist() for v in model.optimizer.variables]}


def run_resume(strategy, initial, x, y, weight, folder):
    """Stage 3 resumed: a fresh model's ``fit`` for 2 epochs with ``zero3``'s backup (made
    at its epoch's end) skips the first epoch and runs the second; the state it restored
    (before any step) and its weights after it (against ``zero3``'s model trained on)."""
    strategy.zero = 3
    whole = build()
    whole.set_weights(initial)
    model = strategy.build_model(whole)
    model.compile(optimizer=optimizer(), loss="mse")
    restored, before = {}, held_state(model)["pieces"]  # a fresh model's: the initial

    class Record(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):  # after the backup's restore
            restored.update(held_state(model))

    model.fit(x, y, sample_weight=weight, batch_size=GLOBAL, epochs=2, shuffle=False,
              verbose=0, callbacks=[strategy.backup_callback(os.path.join(folder, "backup3")),
                                    Record()])
    return {"restored": restored, "before": before, "weights": gathered_weights(strategy, model)}


def gathered_weights(strategy, model):
    gathered = strategy.gather_weights(model)
    if isinstance(gathered, dict):  # tensor: each layer's whole weights, by name
        gathered = [w for layer in build().layers for w in gathered.get(layer.name, [])]
    return None if gathered is None else [np.asarray(w).tolist() for w in gathered]


def main(argv):
    steps, folder = int(argv[0]), argv[1]
    pipeline = os.environ["TFDIST_STRATEGY"] == "pipeline"
    options = {"micro_batches": 2, "split_points": ["d0"]} if pipeline else \
        {"rules": {"d0": "column", "out": "row"}}  # and the embedding split by vocabulary
    strategy = tfdist.get_strategy("auto", **options)
    keras.utils.set_random_seed(1)
    initial = [w.copy() for w in build().get_weights()]
    x, y, weight = data(steps)
    out = {"class": type(strategy).__name__, "zero_from_env": strategy.zero,
           "layout": strategy.backup_layout(), "phases": {}}
    for name, stage, clip in PHASES + STAGE3_PHASES:
        out["phases"][name] = run_phase(strategy, name, stage, initial, x, y, weight, folder,
                                        clip)
    out["phases"]["zero3_resume"] = run_resume(strategy, initial, x, y, weight, folder)
    if strategy.is_chief:
        out["initial"] = [w.tolist() for w in initial]
        out["reference"] = {clip: fit_reference(initial, x, y, weight, clip)
                            for clip in ("global_clipnorm", "clipnorm")}
        trained = build()
        trained.set_weights([np.asarray(w, "float32")
                             for w in out["reference"]["global_clipnorm"][0]])
        trained.compile(loss="mse")
        out["reference_evaluated"] = trained.evaluate(x, y, sample_weight=weight,
                                                      batch_size=GLOBAL, verbose=0)
    report(out)


if __name__ == "__main__":
    main(sys.argv[1:])
