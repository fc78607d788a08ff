"""Per-layer forward/backward time of a Keras model on this machine, and its whole training step.

`profile_model` times each layer alone (its forward, then forward + backward, in a
``tf.function``, on inputs of the shapes the model feeds it) at the batch and its half, quarter
and eighth (`profile_batches`: the per-process batch of 2, 4 and 8 replicas, and micro-batches),
and keeps the points with a least-squares line ``t(b) = c0 + c1 b`` (`fit_curve`): a cost at a
measured batch is read as measured, between two of them straight, beyond them off the line.
The whole training step (forward, backward, the model's own optimizer) is timed the same way:
it carries what the layers alone miss (the loss, the update, the dispatch of one step). Sizes
come from the model: parameters and bytes per layer, activation bytes per sample, and for each
``Embedding`` the rows a batch touches.

Example:
    >>> from tfdist.core import flavour
    >>> keras = flavour.get_keras()
    >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, name="d")])
    >>> prof = profile_model(model, batch=16, repeats=2)
    >>> prof.names, prof.params, prof.step.at(16) > 0
    (('d',), (36,), True)
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tfdist.advise.curve import Line, fit_curve, fit_line
from tfdist.core import flavour
from tfdist.errors import AdviseError, format_error

__all__ = ["Line", "EmbeddingUse", "ModelProfile", "profile_model", "profile_batches", "fit_line",
           "fit_curve", "tensor_parts",
           "SPLIT_CLASSES"]


@dataclasses.dataclass(frozen=True)
class EmbeddingUse:
    """One embedding table: its size and how many of its rows a batch reads.

    Attributes:
        layer: Layer name.
        rows: Rows of the table (``input_dim``).
        row_bytes: Bytes of one row.
        unique_per_sample: Distinct rows one sample touches, measured on a batch of data
            (or the lookups per sample, an upper bound, when no data was given).
        measured_on: Rows of data the fraction was measured on (0: none, upper bound).
    """

    layer: str
    rows: int
    row_bytes: int
    unique_per_sample: float
    measured_on: int

    def touched_bytes(self, batch: int) -> float:
        """Bytes of the rows a batch of ``batch`` samples reads (and whose gradient it pushes)."""
        return min(self.rows, self.unique_per_sample * batch) * self.row_bytes


@dataclasses.dataclass(frozen=True)
class ModelProfile:
    """Measured costs and sizes of one model on one machine.

    Attributes:
        names: Layer names (model order, inputs excluded).
        params: Parameters per layer.
        param_bytes: Weight bytes per layer.
        activation_bytes: Output bytes per sample of each layer.
        forward: Per-layer forward time as a line in the batch.
        backward: Per-layer backward time (forward + backward minus forward).
        step: The whole training step (with the model's optimizer) at one batch.
        optimizer_slots: Optimizer variables per weight (SGD 0, momentum 1, Adam 2).
        embeddings: The model's embedding tables.
        threads: TensorFlow intra-op threads the profile ran with (0: TF's default, every core).
        batch: The largest batch measured.
        split_bytes: Per layer, the weight bytes a tensor split divides by T (`tensor_parts`);
            empty: none known.
        reductions: The activation all-reduces of one training step (forward and backward)
            under tensor parallelism, each as (layer index, bytes per sample): four per
            Transformer block, one for a vocabulary-split embedding, four for vocabulary-split
            logits and their loss (`tensor_parts`). Empty: no Transformer block.
        heads: The attention heads T must divide (their gcd over the model; 0: no attention).
        loop_s: Seconds per step of Keras's ``fit`` loop itself (a one-weight model's step:
            the callbacks, the iterator, the call), part of ``step``; every process of a split
            layout pays it whole (0: not measured).
        weight_tensors: The model's trainable weight tensors (kernels, biases, tables): a
            layout's measured overhead grows with them (`network.Constants.overheads`);
            0: not counted.
        inter_op_threads: TensorFlow inter-op threads the profile ran with (0: TF's default,
            several). With one, a pipeline stage's transfers run after its compute, not
            beside it.
    """

    names: tuple[str, ...]
    params: tuple[int, ...]
    param_bytes: tuple[int, ...]
    activation_bytes: tuple[int, ...]
    forward: tuple[Line, ...]
    backward: tuple[Line, ...]
    step: Line
    optimizer_slots: int
    embeddings: tuple[EmbeddingUse, ...]
    threads: int
    batch: int
    split_bytes: tuple[int, ...] = ()
    reductions: tuple[tuple[int, int], ...] = ()
    heads: int = 0
    loop_s: float = 0.0
    weight_tensors: int = 0
    inter_op_threads: int = 0

    @property
    def total_param_bytes(self) -> int:
        return sum(self.param_bytes)

    def bytes_per_shard(self, tensor: int) -> tuple[float, ...]:
        """Per layer, the weight bytes one of ``tensor`` shards holds: split part / T +
        replicated part.

        Example:
            >>> prof = ModelProfile(("a", "b"), (0, 0), (400, 100), (4, 4), (), (), Line(0, 0),
            ...                     0, (), 1, 8, split_bytes=(300, 0))
            >>> prof.bytes_per_shard(2)
            (250.0, 100.0)
        """
        split = self.split_bytes or (0,) * len(self.param_bytes)
        return tuple(s / tensor + (whole - s) for whole, s in zip(self.param_bytes, split,
                                                                  strict=True))

    @property
    def embedding_bytes(self) -> int:
        """Bytes of every embedding table (the sparse part)."""
        return sum(e.rows * e.row_bytes for e in self.embeddings)

    def layer_costs(self, batch: float, tensor: int = 1) -> list[float]:
        """Forward + backward seconds of each layer at ``batch`` (the pipeline's split costs);
        with ``tensor`` T, on one of T shards: a split layer's (``split_bytes`` > 0) divided
        by T, a replicated one's (a LayerNorm, a residual Add) whole.

        Example:
            >>> prof = ModelProfile(("a", "b"), (0, 0), (400, 100), (4, 4), (Line(0, 1),) * 2,
            ...                     (Line(0, 2),) * 2, Line(0, 0), 0, (), 1, 8,
            ...                     split_bytes=(300, 0))
            >>> prof.layer_costs(2), prof.layer_costs(2, tensor=2)
            ([6.0, 6.0], [3.0, 6.0])
        """
        split = self.split_bytes or (1,) * len(self.names)  # unknown: every layer split
        return [(f.at(batch) + b.at(batch)) / (tensor if s else 1)
                for f, b, s in zip(self.forward, self.backward, split, strict=True)]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelProfile:
        lines = lambda rows: tuple(Line(**r) for r in rows)  # noqa: E731
        return cls(**{**data, "names": tuple(data["names"]), "params": tuple(data["params"]),
                      "param_bytes": tuple(data["param_bytes"]),
                      "activation_bytes": tuple(data["activation_bytes"]),
                      "forward": lines(data["forward"]), "backward": lines(data["backward"]),
                      "step": Line(**data["step"]),
                      "embeddings": tuple(EmbeddingUse(**e) for e in data["embeddings"]),
                      "split_bytes": tuple(data.get("split_bytes", ())),
                      "reductions": tuple(tuple(r) for r in data.get("reductions", ()))})


def _median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    fn()  # trace, then warm
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _random_input(symbolic: Any, batch: int, high: int) -> Any:
    import tensorflow as tf

    shape = (batch, *(int(d) for d in tuple(symbolic.shape)[1:]))
    dtype = tf.as_dtype(getattr(symbolic.dtype, "name", symbolic.dtype))
    rng = np.random.default_rng(0)
    if dtype.is_integer:
        return tf.constant(rng.integers(0, max(1, high), size=shape), dtype=dtype)
    return tf.constant(rng.normal(size=shape), dtype=dtype)


def _layer_inputs(layer: Any, batch: int) -> Any:
    high = int(getattr(layer, "input_dim", 2))
    symbolic = layer.input
    made = [_random_input(t, batch, high) for t in _as_list(symbolic)]
    return made if isinstance(symbolic, (list, tuple)) else made[0]


def _layer_call(layer: Any, batch: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of ``layer``'s first call in the model, its symbolic tensors replaced by
    random ones of ``batch`` rows (one per symbolic tensor: ``attention(h, h)`` gets the same
    tensor twice), keyword options kept (``use_causal_mask=True``); else ``(layer.input,)``."""
    import tensorflow as tf

    nodes = getattr(layer, "_inbound_nodes", None) or [None]
    arguments = getattr(nodes[0], "arguments", None)  # Keras 3; tf-keras: call_args/kwargs
    args = getattr(arguments, "args", getattr(nodes[0], "call_args", None))
    kwargs = getattr(arguments, "kwargs", getattr(nodes[0], "call_kwargs", None))
    inputs = getattr(nodes[0], "input_tensors", getattr(nodes[0], "keras_inputs", None))
    symbolic = [] if inputs is None else tf.nest.flatten(inputs)
    if args is None or not symbolic:
        return (_layer_inputs(layer, batch),), {}
    high = int(getattr(layer, "input_dim", 2))
    made = {id(t): _random_input(t, batch, high) for t in symbolic}
    swap = lambda v: made.get(id(v), v)  # noqa: E731
    return (tuple(tf.nest.map_structure(swap, list(args))),
            dict(tf.nest.map_structure(swap, dict(kwargs or {}))))


def _time_layer(layer: Any, batch: int, repeats: int) -> tuple[float, float]:
    """(forward seconds, forward + backward seconds) of ``layer`` alone at ``batch``."""
    import tensorflow as tf

    args, kwargs = _layer_call(layer, batch)
    sources = list({id(t): t for t in tf.nest.flatten((args, kwargs))
                    if tf.is_tensor(t) and t.dtype.is_floating}.values())
    kwargs.setdefault("training", True)
    forward = tf.function(lambda: layer(*args, **kwargs))

    @tf.function
    def both() -> Any:
        with tf.GradientTape() as tape:
            tape.watch(sources)
            y = layer(*args, **kwargs)
        return tape.gradient(y, [*layer.trainable_weights, *sources])

    return _median_seconds(forward, repeats), _median_seconds(both, repeats)


def _call_overhead(repeats: int) -> float:
    """Seconds of calling a ``tf.function`` that does nothing: not part of a layer's cost
    inside a whole step's graph, so subtracted from each layer's timing."""
    import tensorflow as tf

    x = tf.zeros((1,))
    return _median_seconds(tf.function(lambda: tf.identity(x)), max(repeats, 20))


def _inputs_for(model: Any, batch: int, data: Any) -> Any:
    import tensorflow as tf

    if data is not None:
        def pick(a: Any) -> Any:
            return tf.constant(np.asarray(a)[:batch])

        return {k: pick(v) for k, v in data.items()} if isinstance(data, Mapping) else (
            [pick(v) for v in data] if isinstance(data, (list, tuple)) else pick(data))
    made = [_random_input(t, batch, 2) for t in model.inputs]
    return made if len(made) > 1 else made[0]


def _step_fn(model: Any) -> tuple[Callable[[Any], Any], Any]:
    """A ``tf.function`` training step with a fresh copy of the model's optimizer (or SGD)."""
    import tensorflow as tf

    given = getattr(model, "optimizer", None)
    if given is not None and hasattr(given, "get_config"):
        optimizer = type(given).from_config(given.get_config())
    else:
        optimizer = flavour.get_keras().optimizers.SGD(0.01)

    @tf.function
    def step(x: Any) -> Any:
        with tf.GradientTape() as tape:
            out = tf.cast(model(x, training=True), tf.float32)
            loss = tf.reduce_mean(tf.square(out))
        grads = tape.gradient(loss, model.trainable_weights)
        optimizer.apply_gradients(zip(grads, model.trainable_weights, strict=True))
        return loss

    return step, optimizer


def _fit_step_s(model: Any, x: Any, y: Any, batch: int, steps: int) -> float:
    """Median interval between step ends of ``model.fit`` (the compiled model, its own loss and
    optimizer, Keras's loop): what a user's training step costs, fit's start-up left out."""
    import tensorflow as tf

    def rows(a: Any) -> Any:
        return np.resize(np.asarray(a), (max(len(a), batch), *np.shape(a)[1:]))

    xs = {k: rows(v) for k, v in x.items()} if isinstance(x, Mapping) else (
        [rows(v) for v in x] if isinstance(x, (list, tuple)) else rows(x))
    data = tf.data.Dataset.from_tensor_slices((xs, rows(y))).repeat().batch(
        batch, drop_remainder=True)
    ends: list[float] = []
    clock = flavour.get_keras().callbacks.LambdaCallback(
        on_train_batch_end=lambda *_, **__: ends.append(time.perf_counter()))
    model.fit(data, epochs=1, steps_per_epoch=3, verbose=0)
    model.fit(data, epochs=1, steps_per_epoch=steps + 1, verbose=0, callbacks=[clock])
    return statistics.median(b - a for a, b in zip(ends, ends[1:], strict=False))


def _loop_s(steps: int) -> float:
    """Seconds per step of ``fit``'s loop: a compiled one-weight model's step on one sample."""
    keras = flavour.get_keras()
    tiny = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
    tiny.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    one = np.ones((1, 1), np.float32)
    return _fit_step_s(tiny, one, one, 1, steps)


def _slots(optimizer: Any, weights: int) -> int:
    """Optimizer variables per weight (its step counter and learning rate left out)."""
    made = optimizer.variables() if callable(optimizer.variables) else optimizer.variables
    return max(0, (len(made) - 1) // max(1, weights))


def _embeddings(model: Any, data: Any, batch: int) -> tuple[EmbeddingUse, ...]:
    found = []
    named = dict(zip([t.name.split(":")[0] for t in model.inputs], range(len(model.inputs)),
                     strict=True)) if data is not None else {}
    for layer in model.layers:
        if type(layer).__name__ != "Embedding":
            continue
        lookups = int(np.prod([int(d) for d in tuple(layer.input.shape)[1:]] or [1]))
        unique, measured = float(lookups), 0
        source = getattr(layer.input, "name", "").split(":")[0]
        if data is not None and source in named:
            ids = (data[source] if isinstance(data, Mapping) else _as_list(data)[named[source]])
            ids = np.asarray(ids)[:batch]
            unique, measured = len(np.unique(ids)) / len(ids), len(ids)
        found.append(EmbeddingUse(layer.name, int(layer.input_dim), int(layer.output_dim) * 4,
                                  unique, measured))
    return tuple(found)


SPLIT_CLASSES = ("MultiHeadAttention", "EinsumDense", "Dense", "Embedding")
"""Layer classes whose kernels a tensor split divides (Megatron's: heads, feed-forward columns
and rows, vocabulary rows); their biases and every other layer are counted replicated."""


def _sublayers(layer: Any) -> list[Any]:
    """``layer`` and every layer inside it (a Transformer block's attention and Dense)."""
    flatten = getattr(layer, "_flatten_layers", None)
    return list(flatten(include_self=True, recursive=True)) if flatten else [layer]


def tensor_parts(layers: Sequence[Any], activation_bytes: Sequence[int]) -> tuple[
        tuple[int, ...], tuple[tuple[int, int], ...], int]:
    """What tensor parallelism would split in ``layers`` (the model's, in order), by class:
    (split bytes per layer, a step's all-reduces as (layer, bytes per sample), heads' gcd).

    The all-reduces are Megatron's, as the ``tensor`` strategy runs them:

    * each ``MultiHeadAttention``, taken for one Transformer block: four of its output (seq x
      hidden per sample): the sums after the attention and after the feed-forward pair in the
      forward, and the sums of their inputs' gradients in the backward;
    * an ``Embedding`` (split by vocabulary rows): its lookups' sum, in the forward;
    * the last layer when it is a linear ``Dense`` as wide as an ``Embedding``'s vocabulary
      (logits split by vocabulary): its input's gradient summed in the backward, and the
      vocab-parallel loss's three sums of one number per token (the largest logit, the sum of
      exponentials, the target's logit).

    An estimate by class: the tensor strategy's own plan is exact.

    Example:
        >>> from tfdist.core import flavour
        >>> keras = flavour.get_keras()
        >>> x = keras.Input((4, 8))
        >>> y = keras.layers.MultiHeadAttention(2, 4, name="att")(x, x)
        >>> model = keras.Model(x, keras.layers.Dense(8, name="ffn")(y))
        >>> tensor_parts(model.layers[1:], (128, 128))
        ((1120, 256), ((0, 128), (0, 128), (0, 128), (0, 128)), 2)
    """
    split, reductions, heads = [], [], 0
    for index, layer in enumerate(layers):
        kernels: dict[int, int] = {}
        for sub in _sublayers(layer):
            kind = type(sub).__name__
            if kind == "MultiHeadAttention":
                reductions += [(index, int(activation_bytes[index]))] * 4
                heads = math.gcd(heads, int(getattr(sub, "num_heads", 0)
                                            or getattr(sub, "_num_heads", 0)))
            if kind in SPLIT_CLASSES:
                kernels.update({id(w): int(np.prod(w.shape)) * 4 for w in sub.weights
                                if len(w.shape) >= 2})
        if type(layer).__name__ == "Embedding":
            reductions.append((index, int(activation_bytes[index])))
        split.append(sum(kernels.values()))
    return tuple(split), (*reductions, *_logit_reductions(layers, activation_bytes)), heads


def _logit_reductions(layers: Sequence[Any], activation_bytes: Sequence[int]) -> list[
        tuple[int, int]]:
    """The all-reduces of logits split by vocabulary (as `tfdist.tensor.rules` splits them):
    the input's gradient, and three numbers per token for the loss; none for other outputs."""
    vocabularies = {int(layer.input_dim) for layer in layers
                    if type(layer).__name__ == "Embedding"}
    last, index = layers[-1], len(layers) - 1
    units = getattr(last, "units", None)
    linear = getattr(getattr(last, "activation", None), "__name__", "linear") == "linear"
    if type(last).__name__ != "Dense" or units not in vocabularies or not linear or index < 1:
        return []
    per_token = activation_bytes[index] // units
    return [(index, int(activation_bytes[index - 1])), *[(index, int(per_token))] * 3]


def profile_batches(batch: int, small_batch: int | None = None) -> list[int]:
    """The batches a profile measures: ``batch`` and its half, quarter and eighth (the
    per-process batch of 2, 4 and 8 replicas, and pipeline micro-batches), or ``batch`` and
    ``small_batch`` where one is given.

    Example:
        >>> profile_batches(256), profile_batches(32, small_batch=4), profile_batches(2)
        ([32, 64, 128, 256], [4, 32], [1, 2])
    """
    if small_batch:
        return sorted({max(1, small_batch), batch})
    return sorted({max(1, batch // k) for k in (8, 4, 2, 1)})


def profile_model(model: Any, batch: int, data: Any = None, repeats: int = 5,
                  small_batch: int | None = None, labels: Any = None) -> ModelProfile:
    """Measures ``model`` (a built Keras model) at ``batch`` and a smaller batch.

    Args:
        model: A built Keras model (Sequential or functional). Its weights are trained for a
            few steps by the profile; pass a copy if that matters.
        batch: The largest per-device batch to measure (the global batch).
        data: Optional inputs (array, list or dict of arrays, at least ``batch`` rows): used
            for the step and to count the embedding rows a batch touches.
        repeats: Timed calls per measurement (median taken).
        small_batch: Measure only ``batch`` and this batch (default: ``batch`` and its
            half, quarter and eighth, `profile_batches`).
        labels: Targets for ``data``: with them, a compiled model's step is timed in its own
            ``fit`` (its loss, optimizer and Keras's loop), else in a ``tf.function`` step with a
            squared loss and a fresh copy of its optimizer.

    Raises:
        AdviseError: ``batch`` is not a positive int, or the model has no layers.
    """
    import tensorflow as tf

    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise AdviseError(format_error("batch must be a positive int.", received=f"batch={batch!r}",
                                       expected="an int >= 1", fix="pass batch=64"))
    layers = [layer for layer in model.layers if type(layer).__name__ != "InputLayer"]
    if not layers:
        raise AdviseError(format_error("The model has no layers to profile.",
                                       received=f"model {model.name!r}", expected="a built model",
                                       fix="build the model with keras.Input first"))
    sizes = profile_batches(batch, small_batch)
    fwd, both = {b: [] for b in sizes}, {b: [] for b in sizes}
    overhead = _call_overhead(repeats)
    for b in sizes:
        for layer in layers:
            f, fb = _time_layer(layer, b, repeats)
            fwd[b].append(max(f - overhead, 0.0))
            both[b].append(max(fb - f, 0.0))
    step, optimizer = _step_fn(model)
    loop_s = 0.0
    if labels is not None and data is not None and getattr(model, "optimizer", None) is not None:
        # 40 steps a batch at the default 5 repeats: a step of 10-20 ms read over 20 steps
        # moved by 12% between two profiles of the same model minutes apart
        step_s = [_fit_step_s(model, data, labels, b, 8 * repeats) for b in sizes]
        loop_s = _loop_s(4 * repeats)
    else:
        step_s = [_median_seconds(lambda b=b: step(_inputs_for(model, b, data)), repeats)
                  for b in sizes]
    per_sample = lambda layer: int(np.prod([int(d) for d in tuple(  # noqa: E731
        _as_list(layer.output)[0].shape)[1:]] or [1])) * 4
    activation_bytes = tuple(per_sample(layer) for layer in layers)
    split_bytes, reductions, heads = tensor_parts(layers, activation_bytes)
    return ModelProfile(
        names=tuple(layer.name for layer in layers),
        params=tuple(int(layer.count_params()) for layer in layers),
        param_bytes=tuple(sum(int(np.prod(w.shape)) * 4 for w in layer.weights)
                          for layer in layers),
        activation_bytes=activation_bytes,
        forward=tuple(fit_curve(sizes, [fwd[b][i] for b in sizes]) for i in range(len(layers))),
        backward=tuple(fit_curve(sizes, [both[b][i] for b in sizes])
                       for i in range(len(layers))),
        step=fit_curve(sizes, step_s),
        optimizer_slots=_slots(optimizer, len(model.trainable_weights)),
        embeddings=_embeddings(model, data, batch),
        threads=tf.config.threading.get_intra_op_parallelism_threads(), batch=batch,
        split_bytes=split_bytes, reductions=reductions, heads=heads, loop_s=loop_s,
        weight_tensors=len(model.trainable_weights),
        inter_op_threads=tf.config.threading.get_inter_op_parallelism_threads())
