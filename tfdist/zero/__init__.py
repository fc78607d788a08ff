"""ZeRO-sharded data parallelism (arXiv 1910.02054) for Keras 3 on TensorFlow.

* `partition` (no TensorFlow): which data rank owns which rows of which weight, balanced by
  bytes;
* `engine`: the step's collectives (gradients summed onto their owners, norms over every part,
  the updated parts gathered) and what a process holds;
* `layerwise`: stage 3's step layer by layer (each layer gathered for its forward and its
  backward, its gradient reduce-scattered as it appears);
* `model`: the user's model with ZeRO's steps (`model.attach`);
* `data_axis` (stages 1-2) and `data_axis_layers` (stage 3): the same on the data axis of the
  pipeline (one stage's replicas) and tensor (one shard's replicas) strategies.

`tfdist.strategies.zero.ZeroStrategy` (``get_strategy("multi_worker", zero=stage)``) puts them
together.
"""
