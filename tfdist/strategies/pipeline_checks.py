"""What a `PipelineStrategy` refuses before training: an optimizer option it cannot apply as
one device would, a batch that does not cut into replicas x micro-batches, and the settings
``weight_gradients="whole_batch"`` and ZeRO stage 3 cannot run.

`PipelineStrategy` (`tfdist.strategies.pipeline`) mixes it in; the stage model
(`tfdist.pipeline.keras_model`) calls `check_optimizer`, `check_rows` and `check_batch`.

Example:
    >>> from tfdist.strategies.pipeline import PipelineStrategy
    >>> strategy = PipelineStrategy(micro_batches=2)
    >>> strategy.check_rows(4)
    >>> strategy.check_rows(3)
    Traceback (most recent call last):
    ...
    tfdist.errors.StrategyConfigError: A global batch of 3 rows cannot be cut into 1 replica(s) ...
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdist.errors import StrategyConfigError, format_error
from tfdist.pipeline import optimizers, stage, tied
from tfdist.pipeline.config import PipelineConfig
from tfdist.pipeline.layout import PipelineLayout

__all__ = ["PipelineChecksMixin"]


class PipelineChecksMixin:
    """The refusals of a `PipelineStrategy`, read from its settings and its split model."""

    config: PipelineConfig
    spec: stage.ModelSpec | None
    bounds: tuple[int, ...] | None
    split: Any
    zero: int | None
    layout: PipelineLayout  # the strategy's properties
    micro_batches: int
    shards: int

    def check_optimizer(self, optimizer: Any) -> None:
        """Raises before training for an optimizer option the pipeline cannot apply as one
        device would (`tfdist.pipeline.optimizers`: which options are exact, which refused)."""
        optimizers.check_optimizer(optimizer, spans_processes=not self.layout.holds_all)
        if self.split is not None:
            from tfdist.tensor.stages import check_clipping

            check_clipping(optimizer)
        if self.spec is not None and self.bounds is not None:
            tied.check_clipping(optimizer, self.spec, self.bounds)
        if self.zero:
            from tfdist.zero.data_axis import check_zero_optimizer

            shared = self.spec is not None and self.bounds is not None and \
                bool(tied.shared_layers(self.spec, self.bounds))
            check_zero_optimizer(optimizer, self.zero, tied=shared)

    def check_rows(self, rows: int) -> None:
        """Raises unless a batch of ``rows`` rows divides into D replicas x M micro-batches."""
        parts = self.layout.replicas * self.micro_batches
        if int(rows) % parts:
            fix = (f"use a batch size that is a multiple of {parts} (and drop_remainder=True in "
                   "Dataset.batch, or a row count that is a multiple of the batch size)")
            if int(rows) < parts:
                fix = (f"use at most {max(1, int(rows) // self.layout.replicas)} micro-batches "
                       f"(each needs a row of every replica's batch), or a batch of {parts} "
                       "rows or more")
            raise StrategyConfigError(format_error(
                f"A global batch of {int(rows)} rows cannot be cut into {self.layout.replicas} "
                f"replica(s) x {self.micro_batches} micro-batch(es).",
                received=f"batch={int(rows)}", expected=f"a multiple of {parts}", fix=fix))

    def check_batch(self, x: Any) -> None:
        """`check_rows` for a batch tensor: at trace time if its row count is static, else a
        runtime assertion."""
        x = tf.nest.flatten(x)[0]
        rows = x.shape[0]
        if rows is not None:
            self.check_rows(rows)
        else:
            parts = self.layout.replicas * self.micro_batches
            tf.debugging.assert_equal(
                tf.shape(x)[0] % parts, 0,
                message=f"tfdist pipeline: every batch must be a multiple of {parts} rows "
                "(replicas x micro_batches); batch with drop_remainder=True")

    def _check_zero3(self) -> None:
        """Refuses, before any process waits, a pipeline ZeRO stage 3 cannot run."""
        from tfdist.zero.data_axis_layers import check_pipeline_stage3

        check_pipeline_stage3(self.config.schedule, self.config.chunks,
                              self.config.weight_gradients, self.layout.holds_all)

    def _check_whole_batch(self, spec: stage.ModelSpec) -> None:
        """Refuses ``weight_gradients="whole_batch"`` where a second run of a stage would
        differ from its first (a random layer) or its stages are split (T > 1)."""
        if self.config.weight_gradients != "whole_batch":
            return
        from tfdist.pipeline.batch_weights import random_layers

        found = random_layers([(s.name, s.class_name, s.config) for s in spec.layers])
        if found or self.shards > 1:
            raise StrategyConfigError(format_error(
                "weight_gradients='whole_batch' runs each stage a second time on the whole "
                "replica batch, which must give what its micro-batches gave.",
                received=f"random layers {found}, tensor={self.shards}",
                expected="no layer with a random seed (Dropout, noise), tensor=1",
                fix="use weight_gradients='sum' (the default)"))
