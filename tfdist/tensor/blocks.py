"""A process's shard of a model of blocks (a KerasHub task), from the plan to the Keras model.

`tfdist.strategies.tensor.TensorStrategy` takes this path when a top-level layer of the model
holds weighted layers (`tfdist.tensor.nested.is_nested`). Unlike the top-level path
(`tfdist.tensor.build`, layers rebuilt from their configs as split classes), the whole model is
built in every process, planned (`tfdist.tensor.nested.plan_nested`), checked block by block
(`tfdist.tensor.check`), and then made this process's shard in place
(`tfdist.tensor.inplace`): the split variables are replaced by their slices, so the whole
weights exist in a process only until its shard is made.

Example:
    >>> import keras
    >>> from tfdist.parallel.mesh import Mesh
    >>> from tfdist.tensor.nested import plan_nested
    >>> class Block(keras.layers.Layer):
    ...     def __init__(self, **kwargs):
    ...         super().__init__(**kwargs)
    ...         self.up = keras.layers.Dense(8, name="up")
    ...         self.down = keras.layers.Dense(2, name="down")
    ...     def call(self, x):
    ...         return self.down(self.up(x))
    >>> inputs = keras.Input((2,))
    >>> whole = keras.Model(inputs, Block(name="b")(inputs))
    >>> plan, units = plan_nested(whole, 1)
    >>> shard = shard_model(whole, plan, units, Mesh().group("tensor", 0))
    >>> [layer.name for layer in plan.layers], len(shard.weights)
    (['b/up', 'b/down'], 4)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from tfdist.parallel.mesh import ProcessGroup
from tfdist.tensor.check import TOLERANCE, check_blocks
from tfdist.tensor.inplace import shard_in_place
from tfdist.tensor.nested import Unit, demote
from tfdist.tensor.plan import LayerSplit, TensorPlan

__all__ = ["copy_model", "checked_plan", "shard_model", "WholeSource"]


def copy_model(model: Any) -> Any:
    """A new model of ``model``'s class and config holding its weights (left untouched)."""
    copy = type(model).from_config(model.get_config())
    copy.set_weights(model.get_weights())
    return copy


def checked_plan(whole: Any, plan: TensorPlan, units: tuple[Unit, ...],
                 agree: Callable[[np.ndarray], np.ndarray] | None = None
                 ) -> tuple[TensorPlan, tuple[Unit, ...], dict[str, float]]:
    """``plan`` with every block whose split differs from it whole (`check_blocks`) kept
    whole; and each checked block's gap.

    Args:
        whole: The whole model, before `shard_in_place`.
        plan: Its plan.
        units: Its units.
        agree: Makes every process's gaps the same (the group's maximum); None: these.
    """
    gaps = check_blocks(whole, plan, units)
    if agree is not None and gaps:
        names = sorted(gaps)
        agreed = agree(np.array([min(gaps[n], 1e30) for n in names], np.float64))
        gaps = {name: float(value) for name, value in zip(names, agreed, strict=True)}
    failed = {name: f"whole and split differ by {gap:.2e} of their scale (> {TOLERANCE:g})"
              if gap < 1e30 else "its split could not run whole and split here"
              for name, gap in gaps.items() if not gap <= TOLERANCE}
    plan, units = demote(plan, units, failed)
    checked = {name: f"checked: {gap:.1e}" for name, gap in gaps.items() if name not in failed}
    layers = tuple(_note(layer, checked) for layer in plan.layers)
    return TensorPlan(plan.shards, layers), units, gaps


def _note(layer: LayerSplit, checked: dict[str, str]) -> LayerSplit:
    import dataclasses

    block = next((name for name in checked if layer.name.startswith(name + "/")), None)
    if block is None or not layer.split:
        return layer
    return dataclasses.replace(layer, reason=f"{layer.reason}; block {checked[block]}")


def shard_model(whole: Any, plan: TensorPlan, units: tuple[Unit, ...], group: ProcessGroup,
                timeout: float | None = None, cls: type | None = None) -> Any:
    """``whole`` made this process's shard in place, as a ``cls`` (default ``keras.Model``)
    over the same inputs and outputs."""
    shard_in_place(whole, plan, units, group, timeout)
    return (cls or keras.Model)(inputs=whole._inputs_struct, outputs=whole._outputs_struct,
                                name=whole.name)


class WholeSource:
    """What `tfdist.tensor.build.assemble` needs to make the whole model again: its class and
    config, taken before the model was sharded."""

    def __init__(self, model: Any) -> None:
        self.cls, self.config = type(model), model.get_config()

    def build(self) -> Any:
        return self.cls.from_config(self.config)
