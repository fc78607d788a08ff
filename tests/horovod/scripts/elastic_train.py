"""A tiny ``hvd.elastic.run`` custom loop whose every step can be replayed by a reference.

``python elastic_train.py OUT_DIR [--sabotage]`` under ``tfdist-launch --strategy horovod
--min-workers 1 --max-workers 2``. The model is one Dense layer (linear, mean squared error)
trained with SGD and momentum; the rows of rank ``r`` at step ``s`` come from a generator seeded
by ``(s, r)`` (`elastic_data`), so a step's global batch depends only on the step and the number
of ranks. Gradients are averaged with ``hvd.allreduce``; the model, the optimizer's momentum and
the step are held in ``hvd.elastic.TensorFlowKerasState`` (``--tensorflow-state``: the model's and
optimizer's variables in ``hvd.elastic.TensorFlowState``), committed every `COMMIT_EVERY` steps.

Rank 0 appends JSON lines (each with its time ``t``) to ``OUT_DIR/events.jsonl``: ``start`` (its
pid, the hosts file tfdist wrote, the initial weights), ``step`` (step index and the size it ran
at), ``reset`` (the step the state holds after a reset: the last commit after a failure, the
current step after hosts were added), ``commit``.
Every rank writes ``OUT_DIR/pid-<pid>.json`` (rank, pid, host: its slot) at start, and
``OUT_DIR/final-<pid>.json`` (rank, size, weights) at the end.

``--sabotage`` restores the step counter but not the weights on a failure (what a state that
forgets the model would do): the test's reference must then miss.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import horovod.tensorflow as hvd
import tensorflow as tf
from elastic_data import (
    COMMIT_EVERY,
    FEATURES,
    LR,
    MOMENTUM,
    OUTPUTS,
    PACED_STEPS,
    STEP_SECONDS,
    STEPS,
    rows,
)
from tensorflow import keras


def append(out: Path, record: dict) -> None:
    with open(out / "events.jsonl", "a") as f:
        f.write(json.dumps({**record, "t": time.time()}) + "\n")


def build() -> tuple[keras.Model, keras.optimizers.Optimizer]:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(OUTPUTS)])
    optimizer = keras.optimizers.SGD(LR, momentum=MOMENTUM)
    optimizer.build(model.trainable_variables)  # a joining rank needs the momentum to receive
    return model, optimizer


def main() -> None:
    out, sabotage = Path(sys.argv[1]), "--sabotage" in sys.argv
    hvd.init()
    slot = {"rank": hvd.rank(), "pid": os.getpid(), "host": os.environ.get("HOROVOD_HOSTNAME")}
    (out / f"pid-{os.getpid()}.json").write_text(json.dumps(slot))
    model, optimizer = build()
    loss_fn = keras.losses.MeanSquaredError()
    if "--tensorflow-state" in sys.argv:  # variables, not a Keras model: the other state class
        state = hvd.elastic.TensorFlowState(
            [*model.variables, *optimizer.variables], step=0)
    else:
        state = hvd.elastic.TensorFlowKerasState(model, optimizer, step=0)
    if sabotage:
        state._load_model = lambda: None  # noqa: SLF001 - the sabotage under test
    if hvd.rank() == 0:
        append(out, {"event": "start", "pid": os.getpid(),
                     "hosts_file": os.environ.get("TFDIST_ELASTIC_HOSTS_FILE"),
                     "init": [w.tolist() for w in model.get_weights()]})

    def on_reset() -> None:
        if hvd.rank() == 0:
            append(out, {"event": "reset", "step": state.step, "size": hvd.size()})

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state: hvd.elastic.TensorFlowKerasState) -> None:
        while state.step < STEPS:
            x, y = rows(state.step, hvd.rank())
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            grads = [hvd.allreduce(g, op=hvd.Average) for g in grads]
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            if hvd.rank() == 0:
                append(out, {"event": "step", "step": state.step, "size": hvd.size()})
            state.step += 1
            if state.step % COMMIT_EVERY == 0:
                if hvd.rank() == 0:
                    append(out, {"event": "commit", "step": state.step})
                state.commit()
            if hvd.size() == 1 or state.step < PACED_STEPS:
                time.sleep(STEP_SECONDS)

    train(state)
    final = {"rank": hvd.rank(), "size": hvd.size(),
             "weights": [w.tolist() for w in model.get_weights()]}
    (out / f"final-{os.getpid()}.json").write_text(json.dumps(final))


if __name__ == "__main__":
    main()
