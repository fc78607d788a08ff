"""Pipeline (model) parallelism: a Keras model split into stages, micro-batches pipelined.

Words:

* **stage**: a contiguous slice of the model's layers, held by one process (its variables exist
  there only), or by one device of a process that holds them all (`local`). Stages are
  numbered ``0..K-1`` from the input.
* **micro-batch**: one of the ``M`` equal slices of a replica's batch that flow through the stages
  one after another, so that stages work at the same time (GPipe, arXiv 1811.06965).
* **pipeline replica**: one copy of the whole K-stage pipeline. ``D`` replicas train on disjoint
  parts of each global batch (data parallelism) and average each stage's gradients.

Modules, by concept: `config` (the pipeline's settings, checked once; pure), `partition` (where
to split; pure), `schedule` (which op runs when: the schedule classes and their registry; pure),
`simulator` (the ranks' actions run against each other on paper: order, step time; pure),
`groups` (collective groups by axis; pure), `layout` (which process holds which stages, and its
groups; pure), `transport` (send/recv and all-reduce over TensorFlow collective ops), `stage`
(building only this stage's layers), `interface` (the `PipelineEngine` interface), `engine` (the
one engine: a training step from any schedule's actions, one chunk per process or several, an
op handler per op kind), `split_backward` (the input-gradient and weight-gradient halves of a
split backward), `interleave` (which chunks a process holds, how each sees the pipeline),
`keras_model`
(``model.fit`` on a stage), `loss_and_metrics` (what ``compile``'s loss and metrics become on a
stage), `local` (all stages in one process, one per local device, tensors
handed over in-process), `modes` (the two modes, one stage per process or all on devices,
chosen once).

Example:
    >>> from tfdist.pipeline import schedule
    >>> schedule.gpipe(stages=2, micro_batches=2, stage=0)
    (('F', 0), ('F', 1), ('B', 0), ('B', 1))
"""

from __future__ import annotations
