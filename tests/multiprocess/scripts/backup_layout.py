"""One process of a 2-process tensor job that trains a tiny model one epoch with
``strategy.backup_callback(BACKUP_DIR, delete_checkpoint=False)`` (the backup stays, as after a
crash), and reports its loss. Run again under another mesh, the callback must be refused; that
launch (D=2 x T=1) then runs ``tensor_uneven_rows.py``'s check too (one launch for two tests).

Args: ``BACKUP_DIR``. The mesh comes from ``TFDIST_TENSOR_SHARDS``.
"""

from __future__ import annotations

import sys

import keras
import numpy as np
from tensor_uneven_rows import uneven_rows  # this folder, the script's path[0]

import tfdist
from tfdist.errors import StrategyConfigError
from tfdist.testing import report


def build() -> keras.Model:
    keras.utils.set_random_seed(3)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu", name="up")(inputs)
    hidden = keras.layers.Dense(8, name="down")(hidden)
    return keras.Model(inputs, keras.layers.Dense(1, name="head")(hidden))


def main(backup_dir: str) -> None:
    strategy = tfdist.get_strategy("auto")
    model = strategy.build_model(build())
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    try:
        backup = strategy.backup_callback(backup_dir, delete_checkpoint=False)
    except StrategyConfigError as err:  # refused before fit: the job goes on to the next check
        report({"refused": str(err), "uneven_rows": uneven_rows(strategy)})
        return
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 8)).astype("float32"), rng.normal(size=(16, 1)).astype("float32")
    history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
                        callbacks=[backup])
    report({"loss": history.history["loss"]})


if __name__ == "__main__":
    main(sys.argv[1])
