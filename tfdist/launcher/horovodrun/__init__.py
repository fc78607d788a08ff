"""``horovodrun``: elastic Horovod (`elastic`: ``--min-workers``/``--max-workers``)."""
