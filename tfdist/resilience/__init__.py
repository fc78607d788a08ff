"""Resilience: backups, saving at the step on SIGTERM, and resuming there, in one package.

A job that is killed or preempted resumes from what its processes saved. Everything a training
process does for that is here, one module per concept; the launcher's side (forwarding SIGTERM,
the grace period, exit 75 or 143) is `tfdist.launcher.supervisor`, and the strategies reach this
package through their methods (``strategy.backup_callback``, ``strategy.preemption_handler``,
``backup_layout``; `tfdist.strategies.saving`).

* `tfdist.resilience.preemption`: the contract every part shares (exit status 75, the marker
  line the launcher reads, TensorFlow's termination config, the input skipped on resume) and the
  custom-loop handler of the data-parallel strategies; TensorFlow only inside its functions, so
  the launcher imports its constants;
* `tfdist.resilience.backup`: ``strategy.backup_callback(dir)`` under every strategy and both
  Kerases (who writes, who restores, per-rank directories), tf-keras's save at the step;
* `tfdist.resilience.keras3_backup`: Keras 3's save at the step (MultiWorkerMirrored);
* `tfdist.resilience.pipeline_vote`: the processes of a model-parallel job (pipeline stages,
  tensor shards) agree on the step to stop at (a vote after each step), each saves its own
  part (`StepCheckpoint`), the custom-loop handler;
* `tfdist.resilience.pipeline_backup`: the ``fit`` callback over that vote, and the strategy
  mixins that hand it out (`StepBackupMixin`: pipeline and tensor; `PipelineBackupMixin`);
* `tfdist.resilience.claim`: a backup directory claimed by one job, for the layout (mesh, stages)
  its per-rank backups were written for.

This package's ``__init__`` imports nothing: import the modules by name.

Example:
    >>> from tfdist.resilience.preemption import PREEMPTED_EXIT_STATUS, marker_line
    >>> PREEMPTED_EXIT_STATUS, marker_line("step 4 in /runs/backup")
    (75, 'tfdist-preempted: saved a checkpoint at step 4 in /runs/backup')
"""
