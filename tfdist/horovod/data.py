"""Input splitting for one replica per process: each rank takes its slice of every global batch.

``tf.distribute.MirroredStrategy`` splits each batch of the dataset given to ``fit`` across its
replicas. `split_global_batches` does the same across processes, so a script written for a
global batch (``model.fit(x, y, batch_size=global_batch)``) trains identically whether its
replicas are devices or Horovod ranks. Every rank reads the whole input and keeps its part.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdist.errors import StrategyConfigError, format_error

__all__ = ["split_global_batches", "slice_bounds"]


def slice_bounds(batch: Any, num_parts: int, index: int) -> tuple[Any, Any]:
    """Rows ``[start, end)`` of a batch of ``batch`` rows that part ``index`` of ``num_parts`` gets.

    Parts differ by at most one row: ``start = batch * index // num_parts``.

    Example:
        >>> slice_bounds(8, 2, 1), slice_bounds(5, 2, 0), slice_bounds(5, 2, 1)
        ((4, 8), (0, 2), (2, 5))
    """
    return batch * index // num_parts, batch * (index + 1) // num_parts


def _slice(value: Any, num_parts: int, index: int) -> Any:
    if isinstance(value, tf.SparseTensor):
        start, end = slice_bounds(value.dense_shape[0], num_parts, index)
        begin = tf.concat([[start], tf.zeros_like(value.dense_shape[1:])], axis=0)
        return tf.sparse.slice(value, begin, tf.concat([[end - start], value.dense_shape[1:]], 0))
    rows = value.nrows() if isinstance(value, tf.RaggedTensor) else tf.shape(value)[0]
    start, end = slice_bounds(rows, num_parts, index)
    return value[start:end]


def _check_batched(dataset: tf.data.Dataset) -> None:
    for spec in tf.nest.flatten(dataset.element_spec):
        shape = getattr(spec, "shape", None)
        if shape is not None and shape.rank == 0:
            raise StrategyConfigError(
                format_error(
                    "The dataset must yield batches to be split across Horovod ranks.",
                    received=f"elements with a scalar component ({spec})",
                    expected="batched elements (first dimension = the global batch)",
                    fix="call dataset.batch(global_batch_size) first, or pass "
                    "split_batches=False if every rank already reads its own batches",
                )
            )


def split_global_batches(dataset: tf.data.Dataset, num_parts: int, index: int) -> tf.data.Dataset:
    """Keeps part ``index`` of ``num_parts`` of every batch (every component sliced alike).

    Example:
        >>> ds = tf.data.Dataset.range(8).batch(4)
        >>> [b.numpy().tolist() for b in split_global_batches(ds, 2, 1)]
        [[2, 3], [6, 7]]
    """
    if num_parts == 1:
        return dataset
    _check_batched(dataset)

    structure = dataset.element_spec

    def take_part(*element: Any) -> Any:  # tf.data unpacks tuples into arguments
        parts = [_slice(v, num_parts, index) for v in tf.nest.flatten(element)]
        return tf.nest.pack_sequence_as(structure, parts)

    return dataset.map(take_part, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
