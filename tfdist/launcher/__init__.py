"""``tfdist-launch``: start, plan, export and check distributed TensorFlow jobs.

The command line and what every runner shares:

* `tfdist.launcher.cli`: the ``tfdist-launch`` command line (``main``): parse, plan, hand the plan
  to the runner the command line asks for.
* `tfdist.launcher.arguments`: the job's argument groups, and the namespace turned into typed
  options (`job_options`).
* `tfdist.launcher.options`: those options (`JobOptions`, `StrategyOptions`, `ExportOptions`).
* `tfdist.launcher.plan`: `plan_job`, options -> the `JobPlan` every runner reads (``auto``,
  traits and layout checks decided there only); `tfdist.launcher.mesh_plan`: its D x K x T mesh.
* `tfdist.launcher.placement`: `place`, a plan -> processes here or on hosts (ports, TF_CONFIG,
  ``horovodrun``/``mpirun`` arguments, elastic ``horovodrun``).
* `tfdist.launcher.runners`: the runner registry, one `Runner` record each (its arguments,
  checks, options, dry run and run); the CLI reads only this.
* `tfdist.launcher.supervisor`: the one failure policy, over any runner's `TaskGroup`.
* `tfdist.launcher.process`: the process group that starts and stops a job's tasks together;
  `tfdist.launcher.output`: which of their lines are shown; `tfdist.launcher.containment`:
  the job's cgroup and the guardian that ends every process of it with the launcher.
* `tfdist.launcher.check`: ``--check``, what is installed.

The runner families, a folder each (its ``__init__`` holds its record, ``RUNNER``):

* `tfdist.launcher.local`: this machine (`tasks.LocalTasks`, `netns`: a private network).
* `tfdist.launcher.hosts`: ``--hosts``/``--hostfile`` over ssh (`layout`, `ssh`, `remote`).
* `tfdist.launcher.ray`: ``--ray [ADDRESS]``, a gang of Ray actors (`gang`, `actor`, `options`).
* `tfdist.launcher.export`: ``--export kubeflow|mpijob|slurm`` (`documents`).
* `tfdist.launcher.slurm`: what runs inside the Slurm allocation (`task`, `horovod`).
* `tfdist.launcher.horovodrun`: elastic ``horovodrun`` (`elastic`).

Importing this package imports none of them (and no TensorFlow).
"""
