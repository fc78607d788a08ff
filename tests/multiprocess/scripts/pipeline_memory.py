"""One process of a K-stage pipeline built from a build function (no process builds the whole
model): reports what its stage holds and how much this process's memory grew to build and train
it. The model is two wide layers (``WIDTH`` x ``WIDTH`` floats each, 64 MiB) around narrow ones.

The control: the same process then builds the whole model for real; its memory grows by about the
whole model's size, which the stage's build must stay well under."""

from __future__ import annotations

import contextlib
import gc
import sys

import numpy as np

import tfdist
from tfdist.bench import memory
from tfdist.core import flavour
from tfdist.pipeline.stage import weights_nbytes
from tfdist.testing import report

WIDTH, FEATURES = 4096, 8


def build(keras):
    return keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(WIDTH, activation="relu", name="widen"),
        keras.layers.Dense(WIDTH, activation="relu", name="wide_a"),
        keras.layers.Dense(WIDTH, activation="relu", name="wide_b"),
        keras.layers.Dense(1, name="out"),
    ])


def rss_bytes() -> int:
    """This process's resident memory now (not its peak: initialisers briefly hold copies)."""
    gc.collect()
    return memory.rss_bytes()


@contextlib.contextmanager
def count_variable_bytes(tf):
    """Bytes of every tf.Variable created inside (Keras 3 and tf-keras variables are tf.Variables
    underneath): what a build really allocated, unlike resident memory, which on some machines
    keeps 100+ MB of freed initialiser temporaries after a first large build."""
    created: list[int] = []

    def creator(next_creator, **kwargs):
        variable = next_creator(**kwargs)
        created.append(int(variable.shape.num_elements()) * variable.dtype.size)
        return variable

    with tf.variable_creator_scope(creator):
        yield created


def main(argv):
    keras = flavour.get_keras()
    strategy = tfdist.get_strategy("auto")
    x = np.random.default_rng(0).normal(size=(64, FEATURES)).astype("float32")
    y = x[:, :1] * 2
    import tensorflow as tf

    tf.constant(0.0) + 1  # the runtime's own memory, before measuring
    before = rss_bytes()
    with count_variable_bytes(tf) as stage_created:
        model = strategy.build_model(lambda: build(keras))
    stage_growth = rss_bytes() - before
    before_whole = rss_bytes()
    with count_variable_bytes(tf) as whole_created:
        whole = build(keras)
    whole_growth = rss_bytes() - before_whole
    whole_bytes = weights_nbytes(whole.weights)
    del whole
    model.compile(optimizer=keras.optimizers.SGD(1e-3), loss="mse")
    # shuffle=False: an unseeded shuffle gives each stage other batches (the batch check refuses it)
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
    report({
        "stage": strategy.stage_report(), "held_bytes": weights_nbytes(model.weights),
        "whole_bytes": whole_bytes, "stage_build_growth": stage_growth,
        "whole_build_growth": whole_growth, "loss": history.history["loss"],
        "stage_created_bytes": sum(stage_created), "whole_created_bytes": sum(whole_created),
    })


if __name__ == "__main__":
    main(sys.argv[1:])
