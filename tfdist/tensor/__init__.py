"""Tensor (intra-operator) parallelism: layers split across the processes of a tensor group.

* `tfdist.tensor.layers`: the split Keras 3 layers (column/row ``Dense``, heads-split
  ``MultiHeadAttention``, vocabulary-split ``Embedding``);
* `tfdist.tensor.loss`: cross-entropy on vocabulary-split logits;
* `tfdist.tensor.rules` and `tfdist.tensor.plan`: which layer is split how, as data;
* `tfdist.tensor.build`: a process's shard built from configs, weights sliced and gathered;
* `tfdist.tensor.model`: the shard's Keras model and its training step;
* `tfdist.tensor.nested`, `tfdist.tensor.inplace`, `tfdist.tensor.check`,
  `tfdist.tensor.blocks`: models of blocks (KerasHub): the whole layer tree planned, each block
  checked whole against split before training, the split layers sliced in place.

They sit on the model-parallel substrate (`tfdist.parallel`: the mesh, the collectives and
Megatron's mappings), beside `tfdist.pipeline`. The strategy that uses them is
`tfdist.strategies.tensor.TensorStrategy` (``"tensor"``).
"""

from tfdist.tensor.plan import SPLIT_KINDS, LayerSplit, TensorPlan, WeightSplit

__all__ = ["SPLIT_KINDS", "LayerSplit", "TensorPlan", "WeightSplit"]
