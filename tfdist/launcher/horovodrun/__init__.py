"""``horovodrun``: how a Horovod job's ranks start on this machine or on ``--hosts``.

* `command`: the one horovodrun process (``-np``, ``-H``, Gloo or MPI; each rank's command).
* `elastic`: ``--min-workers``/``--max-workers`` (discovery script, hosts file, slot addresses).

Not a runner of its own: the local runner starts the horovodrun process that
`tfdist.launcher.placement` lays out from `command`, when the strategy's ranks are Horovod's
(``launch == "ranks"``).
"""
