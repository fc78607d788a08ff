"""What runs inside a Slurm allocation that ``--export slurm`` wrote.

* `task`: ``python -m tfdist.launcher.slurm.task``, one task of the ``srun`` step.
* `horovod`: ``python -m tfdist.launcher.slurm.horovod``, Gloo's rendezvous beside ``srun``.
"""
