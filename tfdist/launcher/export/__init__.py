"""``--export kubeflow|mpijob|slurm``: the job written for a scheduler (`documents`)."""
