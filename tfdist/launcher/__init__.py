"""``tfdist-launch``: start, plan, export and check distributed TensorFlow jobs.

Modules:

* `tfdist.launcher.cli`: the ``tfdist-launch`` command line (``main``): parse, plan, dispatch.
* `tfdist.launcher.arguments`: its parser, one function per argument group, and the namespace
  turned into typed options (`job_options`).
* `tfdist.launcher.options`: those options (`JobOptions`, `StrategyOptions`, `ExportOptions`).
* `tfdist.launcher.plan`: `plan_job`, options -> the `JobPlan` every runner reads (``auto``,
  traits and layout checks decided there only).
* `tfdist.launcher.placement`: `place`, a plan -> processes here or on hosts (ports, TF_CONFIG,
  ``horovodrun``/``mpirun`` arguments, elastic ``horovodrun``).
* `tfdist.launcher.local.tasks`: runs a plan on this machine (gang start, stop all on failure).
* `tfdist.launcher.process`: the process group that starts and stops a job's tasks together.
* `tfdist.launcher.hosts.layout`: ``--hosts`` / ``--hostfile``: laying a job out over several
  machines.
* `tfdist.launcher.hosts.ssh`: the ``ssh`` command line of a remote task.
* `tfdist.launcher.hosts.remote`: ``python -m tfdist.launcher.hosts.remote``, the remote side of
  such a task.
* `tfdist.launcher.ray.gang`: ``--ray [ADDRESS]``, a job as a gang of Ray actors (`run_on_ray`).
* `tfdist.launcher.ray.actor`: the actor that runs one task on its Ray node.
* `tfdist.launcher.export.documents`: ``--export kubeflow|mpijob|slurm``.
* `tfdist.launcher.slurm.task`: ``python -m tfdist.launcher.slurm.task``, one task of a Slurm step.
* `tfdist.launcher.check`: ``--check``, what is installed.

Importing this package imports none of them (and no TensorFlow).
"""
