"""``--hosts``/``--hostfile``: a job's tasks on other machines, as local ``ssh`` processes.

* `layout`: the hosts, their slots, and which task runs where (`HostOptions`).
* `ssh`: the ``ssh`` command line of a remote task.
* `remote`: ``python -m tfdist.launcher.hosts.remote``, the remote side of such a task.
"""
