"""One shuffle for every process of a model-parallel job: Keras's own array ``fit``, seeded alike.

``model.fit(x, y)`` on arrays shuffles by default (``shuffle=True``, both Kerases): the data
adapter draws one permutation of the rows with ``tf.random.shuffle``, whose seed, with no
global seed set, is drawn from the operating system: a different permutation on every process.
Under ``pipeline`` and ``tensor`` every process must read the same global batch, so the
consistency check stopped such a job at step 1 (`tfdist.parallel.consistency`).

Instead, at such a ``fit`` (array input, ``shuffle`` on, no global TF seed), the job agrees a
seed: rank 0 draws one and writes it in the coordination service, the others read it
(`agree_seed`). The global TF seed is set to it while Keras builds the input pipeline (whose
permutation op takes its seed when the pipeline is traced) and unset as soon as the strategy
receives that dataset (`release`, from ``experimental_distribute_dataset``), so the training
step's own random ops are traced as they would have been. Every process then reads the
permutation that one process draws after ``tf.random.set_seed(seed)`` (`last_seed`), as the
multi-process test checks against such a run. A script that sets a seed itself
(``keras.utils.set_random_seed``) is left alone: its processes already agree.

Example:
    >>> import numpy as np
    >>> shuffles_arrays({"x": np.zeros((4, 2))}), shuffles_arrays({"x": np.zeros(4),
    ...                                                            "shuffle": False})
    (True, False)
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist.errors import StrategyConfigError, format_error

__all__ = ["SEED_KEY", "shuffles_arrays", "global_seed", "agree_seed", "seeded_fit", "release",
           "last_seed"]

SEED_KEY = "tfdist/shuffle_seed/{call}"
"""The coordination service's key of the seed rank 0 drew for the job's Nth shuffled fit."""

_state: dict[str, Any] = {"held": False, "last": None}


def _is_array(value: Any) -> bool:
    return isinstance(value, (np.ndarray, tf.Tensor)) or (
        hasattr(value, "__array__") and hasattr(value, "shape"))


def shuffles_arrays(call: Mapping[str, Any]) -> bool:
    """Whether a ``fit`` call's arguments make Keras shuffle arrays: ``x`` an array (or a
    list, tuple or dict of them) and ``shuffle`` on (Keras's default: True)."""
    if not call.get("shuffle", True):
        return False
    leaves = tf.nest.flatten(call.get("x"))
    return bool(leaves) and all(_is_array(leaf) for leaf in leaves)


def global_seed() -> int | None:
    """TensorFlow's global seed (``tf.random.set_seed``), None when unset; read without
    drawing an op seed (``random_seed.get_seed`` would)."""
    from tensorflow.python.eager import context

    return context.global_seed()


def agree_seed(rank: int, size: int, call: int, timeout: float) -> int:
    """The seed of the job's ``call``-th shuffled fit: rank 0 draws it and writes it in the
    coordination service; the others wait for it (at most ``timeout`` s).

    Raises:
        StrategyConfigError: Rank 0 wrote no seed within ``timeout`` (it did not call the
            same ``fit``).
    """
    from tensorflow.python.eager import context

    key = SEED_KEY.format(call=call)
    if rank == 0 or size < 2:
        seed = random.SystemRandom().randrange(1, 2**31 - 1)
        if size > 1:
            context.context().set_config_key_value(key, str(seed))
        return seed
    try:
        return int(context.context().get_config_key_value(key, max(1, int(timeout * 1e3))))
    except (tf.errors.DeadlineExceededError, tf.errors.NotFoundError) as err:
        raise StrategyConfigError(format_error(
            "Every process of a model-parallel job must shuffle its arrays alike, and rank 0 "
            f"did not give this fit's shuffle seed within {timeout:g} s.",
            received=f"model.fit call {call} (arrays, shuffle=True) on rank {rank} only",
            expected="model.fit called on every process of the job alike",
            fix="call model.fit with the same arguments on every process, or pass "
                "shuffle=False, or seed the job (keras.utils.set_random_seed(S) on every "
                "process)")) from err


@contextlib.contextmanager
def seeded_fit(seed: int) -> Iterator[None]:
    """Sets TensorFlow's global seed to ``seed`` until `release` (the strategy received the
    fit's dataset) or the end of the block, whichever comes first; then unsets it."""
    tf.random.set_seed(seed)
    _state.update(held=True, last=seed)
    try:
        yield
    finally:
        release()


def release() -> None:
    """Unsets the global seed `seeded_fit` set, once (a no-op otherwise)."""
    if _state["held"]:
        _state["held"] = False
        tf.random.set_seed(None)


def last_seed() -> int | None:
    """The seed of this process's last shuffled fit (`seeded_fit`), None before one."""
    return _state["last"]
