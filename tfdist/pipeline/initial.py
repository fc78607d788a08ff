"""Initial weights as one process would draw them, each process drawing only its part.

A one-process build of a model gives each weight's initializer a seed, in the order the build
function makes and builds its layers: a Keras 3 initializer left unseeded takes one from
Python's ``random`` when it is made (so does a ``Dropout``'s seed generator, which has no weight
but moves the stream), a tf-keras one when it is first called. The draw itself is then a
stateless function of that seed. `keras_compat.abstract_build` runs the build function without
allocating weights and so consumes the stream exactly as a one-process build does, leaving every
weight's initializer (`record`) holding the seed that build would have used. A stage or a shard
then calls it for the weights it holds, one weight at a time (`draw`): the whole weight, then its
slice (Megatron-LM's way), so its values are its part of the one-process model and variance
scaling sees the whole layer's fans.

Some initializers cannot be replayed like this (`why_not`): one that is not a Keras class (it may
read a global generator), or one seeded by a ``SeedGenerator`` (its state moves at each call).
Their weights keep the parts consistent instead (`initialise`: a split weight drawn whole by the
first process of its group, which sends it to the others), and the strategies name them in the
plan (`notes`). An unseeded build draws different seeds in each process; `agree_seeds` gives
every process the first process's, so the parts still make one coherent model.

Example:
    >>> import numpy as np
    >>> from tfdist.compat import models as keras_compat
    >>> from tfdist.core.flavour import get_keras
    >>> keras = get_keras()
    >>> def build():
    ...     keras.utils.set_random_seed(0)
    ...     return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="a")])
    >>> with keras_compat.abstract_build():
    ...     draws = record(build().get_layer("a"))
    >>> [d.shape for d in draws], [d.note for d in draws]
    ([(3, 4), (4,)], [None, None])
    >>> kernel = build().get_layer("a").kernel.numpy()
    >>> float(np.abs(np.asarray(draw(draws[0])) - kernel).max())
    0.0
    >>> np.asarray(draw(draws[0], axis=1, index=1, parts=2)).shape
    (3, 2)
"""

from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist.compat import models as keras_compat
from tfdist.parallel.keys import WEIGHTS, instance_key
from tfdist.parallel.mesh import ProcessGroup
from tfdist.parallel.ops import group_broadcast

__all__ = ["WeightDraw", "record", "why_not", "agree_seeds", "draw", "initialise",
           "initialise_layers", "drawn_when_made", "notes", "log_notes", "SABOTAGE_ENV"]

_log = logging.getLogger("tfdist")

SEED_CHUNK = 256
"""Seeds go to the other processes in blocks of this many: a fixed shape, so one instance key
per block serves every build (TensorFlow refuses one key with two shapes)."""
SABOTAGE_ENV = "TFDIST_TEST_FRESH_INITIAL_STREAM"
"""Test only: a process whose mesh rank is this value draws its weights from a fresh stream
(seeds of its own), the mechanism broken; the suite checks that its parity test then fails."""


@dataclasses.dataclass(frozen=True)
class WeightDraw:
    """How one weight of the whole model is drawn.

    Attributes:
        initializer: The initializer object the one-process build would call for it (holding
            that build's seed).
        shape: The whole weight's shape.
        dtype: Its dtype.
        note: None when ``initializer`` replays the one-process draw; else why it does not.
        path: The weight's path in the whole model (Keras 3; None for tf-keras), by which a
            stage's variable of the same path is drawn when it is made (`drawn_when_made`).
    """

    initializer: Any
    shape: tuple[int, ...]
    dtype: str
    note: str | None
    path: str | None = None


def record(layer: Any) -> tuple[WeightDraw, ...]:
    """The draws of ``layer``'s weights (``get_weights`` order), from a layer built inside
    `keras_compat.abstract_build`; ``()`` for a layer whose weights exist (a built model), or
    for a ``keras.ops`` call (an operation, no weights)."""
    draws = []
    for weight in getattr(layer, "weights", ()):
        initializer = getattr(weight, "_initializer", None)  # Keras 3: its deferred one
        initializer = getattr(weight, "_tfdist_initializer", initializer)  # tf-keras
        if initializer is None:
            return ()
        dtype = weight.dtype
        draws.append(WeightDraw(initializer, tuple(int(d) for d in weight.shape),
                                getattr(dtype, "name", None) or str(dtype),
                                why_not(initializer), getattr(weight, "path", None)))
    return tuple(draws)


def _random_generator(initializer: Any) -> Any:
    """tf-keras's per-initializer generator (holding its seed), or None."""
    return getattr(initializer, "_random_generator", None)


def why_not(initializer: Any) -> str | None:
    """None when ``initializer`` draws the same values whenever it is called (a Keras class,
    seeded by an int or not random); else why not, in words.

    Example:
        >>> import keras
        >>> why_not(keras.initializers.GlorotUniform()) is None
        True
        >>> why_not(keras.initializers.GlorotUniform(keras.random.SeedGenerator(1)))
        'GlorotUniform is seeded by a SeedGenerator (its state moves at each draw)'
    """
    name = type(initializer).__name__
    module = type(initializer).__module__ or ""
    if not module.startswith(("keras.", "tf_keras.")):
        return f"{name} is not a Keras initializer (its draws cannot be replayed)"
    generator = _random_generator(initializer)
    if generator is not None:  # tf-keras
        if getattr(generator, "_rng_type", None) != "stateless":
            return f"{name} draws from a stateful generator"
        return None
    if hasattr(initializer, "seed") and not isinstance(initializer.seed, int) and \
            _is_random(initializer):
        return f"{name} is seeded by a SeedGenerator (its state moves at each draw)"
    return None


def _is_random(initializer: Any) -> bool:
    from keras.src.initializers.random_initializers import RandomInitializer

    return isinstance(initializer, RandomInitializer)


def _seed(initializer: Any) -> int | None:
    generator = _random_generator(initializer)
    if generator is not None:
        seed = getattr(generator, "_seed", None)
    else:
        seed = getattr(initializer, "seed", None) if _is_random(initializer) else None
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def _set_seed(initializer: Any, seed: int) -> None:
    generator = _random_generator(initializer)
    if generator is not None:
        generator._seed = seed
    else:
        initializer.seed = seed


def _seeded(draws: Sequence[WeightDraw]) -> list[Any]:
    """The replayable initializers of ``draws`` that hold a seed, each once."""
    found: dict[int, Any] = {}
    for d in draws:
        if d.note is None and _seed(d.initializer) is not None:
            found.setdefault(id(d.initializer), d.initializer)
    return list(found.values())


def agree_seeds(draws: Sequence[WeightDraw], group: ProcessGroup, timeout: float = 0.0) -> None:
    """Gives the initializers of ``draws`` (the whole model's, in the same order on every
    process) the seeds they hold on the first process of ``group`` (a collective of the group).

    Seeded, every process drew the same seeds already; unseeded, this makes the parts one
    model (the first process's). ``$TFDIST_TEST_FRESH_INITIAL_STREAM`` (`SABOTAGE_ENV`) set to
    this process's mesh rank draws fresh seeds here instead (a test's sabotage).
    """
    initializers = _seeded(draws)
    seeds = np.zeros(-(-len(initializers) // SEED_CHUNK) * SEED_CHUNK, np.int64)
    seeds[:len(initializers)] = [_seed(i) for i in initializers]
    for block in range(len(seeds) // SEED_CHUNK if group.size > 1 else 0):
        part = slice(block * SEED_CHUNK, (block + 1) * SEED_CHUNK)
        value = group_broadcast(
            tf.constant(seeds[part]) if group.rank == 0 else None, (SEED_CHUNK,), tf.int64,
            group=group, instance=instance_key(WEIGHTS, 0, block), timeout=timeout)
        seeds[part] = value.numpy()
    if os.environ.get(SABOTAGE_ENV) == str(group.members[group.rank]):
        seeds = np.random.default_rng().integers(1, 10**9, size=len(seeds))
    for initializer, seed in zip(initializers, seeds, strict=False):
        _set_seed(initializer, int(seed))


def _slice(whole: Any, axis: int | None, index: int, parts: int) -> Any:
    if axis is None or parts == 1:
        return whole
    size = whole.shape[axis] // parts
    return tf.gather(whole, tf.range(index * size, (index + 1) * size), axis=axis)


def draw(weight: WeightDraw, axis: int | None = None, index: int = 0, parts: int = 1) -> Any:
    """Part ``index`` of ``parts`` along ``axis`` (None: all) of the whole weight as
    ``weight.initializer`` draws it: only this one weight exists whole, for a moment."""
    with warnings.catch_warnings():  # tf-keras: "unseeded and being called multiple times"
        warnings.simplefilter("ignore")
        whole = tf.convert_to_tensor(weight.initializer(weight.shape, dtype=weight.dtype))
    return _slice(whole, axis, index, parts)


def _drawn_on_first(weight: WeightDraw, axis: int, group: ProcessGroup,
                    timeout: float) -> Any:
    """This process's slice of the whole weight drawn by the first process of ``group`` (a
    traced instance key: every member draws its weights in the same order)."""
    whole = draw(weight) if group.rank == 0 else None
    whole = group_broadcast(whole, weight.shape, tf.as_dtype(weight.dtype), group=group,
                            timeout=timeout)
    return _slice(whole, axis, group.rank, group.size)


def initialise(variables: Sequence[Any], draws: Sequence[WeightDraw],
               axes: Sequence[int | None] | None = None, group: ProcessGroup | None = None,
               timeout: float = 0.0) -> None:
    """Assigns each variable its part of the one-process draw (``draws``, the layer's weights
    in the same order; ``axes``: each one's split axis over ``group``, None for whole).

    A weight whose initializer cannot be replayed keeps its own value when it is whole (the
    strategy then copies it from the first holder), and, when split, is drawn whole by the
    first process of ``group`` and sent to the others, so its parts still make one whole.
    """
    axes = list(axes) if axes is not None else [None] * len(draws)
    index, parts = (group.rank, group.size) if group is not None else (0, 1)
    for variable, weight, axis in zip(variables, draws, axes, strict=True):
        if getattr(variable, DRAWN, False):
            continue  # drawn when it was made (`drawn_when_made`)
        if weight.note is None:
            variable.assign(draw(weight, axis, index, parts))
        elif axis is not None and group is not None and group.size > 1:
            variable.assign(_drawn_on_first(weight, axis, group, timeout))


DRAWN = "_tfdist_drawn"
"""Set on a variable whose initial value was its draw (`drawn_when_made`): not drawn again."""


def drawn_when_made(draws: Mapping[str, Sequence[WeightDraw]],
                    axes: Callable[[str], Sequence[int | None] | None] = lambda name: None,
                    group: ProcessGroup | None = None) -> Any:
    """A context (Keras 3) in which each variable made with the path of a replayable weight
    of ``draws`` (by layer name; ``axes`` and ``group`` as `initialise_layers` takes them) is
    made from its part of the one-process draw, not from its own initializer: a stage's
    weights are drawn once, one at a time, and `initialise` leaves them as they are. Any other
    variable (a different path or shape, an initializer that cannot be replayed) is made as
    usual and initialised afterwards.

    Example:
        >>> import numpy as np
        >>> from tfdist.core.flavour import get_keras
        >>> keras = get_keras()
        >>> def build():
        ...     keras.utils.set_random_seed(0)
        ...     return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="a")],
        ...                             name="m")
        >>> with keras_compat.abstract_build():
        ...     draws = {"a": record(build().get_layer("a"))}
        >>> with drawn_when_made(draws):
        ...     keras.utils.set_random_seed(1)   # another stream: the draws still decide
        ...     model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="a")],
        ...                              name="m")
        >>> same = np.array_equal(model.get_layer("a").kernel.numpy(), draw(draws["a"][0]))
        >>> bool(same or keras_compat.keras_flavour() != "keras3")
        True
    """
    index, parts = (group.rank, group.size) if group is not None else (0, 1)
    table: dict[str, tuple[WeightDraw, int | None]] = {}
    for name, weights in draws.items():
        split = list(axes(name) or [None] * len(weights))
        for weight, axis in zip(weights, split, strict=True):
            if weight.note is None and weight.path is not None:
                table[weight.path] = (weight, axis)

    def value_of(variable: Any) -> Callable[[], Any] | None:
        found = table.get(getattr(variable, "path", None))
        if found is None:
            return None
        weight, axis = found
        shape = list(weight.shape)
        if axis is not None:
            shape[axis] //= parts
        if tuple(int(d) for d in variable.shape) != tuple(shape):
            return None
        setattr(variable, DRAWN, True)
        return lambda: draw(weight, axis, index, parts)

    return keras_compat.initial_values(value_of)


def notes(draws: dict[str, Sequence[WeightDraw]]) -> list[str]:
    """One line per weight (``draws``: by layer name) whose initial value is not its part of
    the one-process draw, for the strategy's plan.

    Example:
        >>> import keras
        >>> weird = WeightDraw(keras.initializers.Orthogonal(keras.random.SeedGenerator(1)),
        ...                    (2, 2), "float32", "Orthogonal is seeded by a SeedGenerator")
        >>> notes({"dense": [weird]})
        ["initial weights: layer 'dense' weight 0: Orthogonal is seeded by a SeedGenerator"]
    """
    return [f"initial weights: layer {name!r} weight {i}: {weight.note}"
            for name, weights in draws.items() for i, weight in enumerate(weights)
            if weight.note is not None]


def initialise_layers(model: Any, draws: Mapping[str, Sequence[WeightDraw]],
                      axes: Callable[[str], Sequence[int | None] | None] = lambda name: None,
                      group: ProcessGroup | None = None, timeout: float = 0.0) -> None:
    """`initialise` for every layer of ``model`` named in ``draws`` (the whole model's draws by
    layer name; a layer without draws, or not in ``model``, is left as it is). ``axes(name)``:
    that layer's weights' split axes over ``group`` (None: all whole)."""
    held = {layer.name for layer in model.layers}
    for name, weights in draws.items():
        if weights and name in held:
            initialise(model.get_layer(name).weights, weights, axes(name), group, timeout)


def log_notes(draws: Mapping[str, Sequence[WeightDraw]]) -> list[str]:
    """`notes`, each logged as a warning; returns them."""
    lines = notes(draws)
    for line in lines:
        _log.warning("tfdist: %s; not the one-process draw (its parts are consistent)", line)
    return lines
