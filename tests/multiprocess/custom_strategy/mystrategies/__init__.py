"""A user's own strategies, as a package outside tfdist would define them (used by the tests).

``CountingMirrored`` is a subclass of tfdist's mirrored strategy that inherits its traits;
``FlaggedMultiWorker`` changes one trait: its tasks need ``MYSTRATEGIES_FLAG=on``, which it
checks when it is created, so a launcher that ignores the traits fails the job.
"""

from __future__ import annotations

import dataclasses
import os

from tfdist.strategies.mirrored import MirroredStrategy
from tfdist.strategies.multi_worker import MultiWorkerMirroredStrategy

FLAG = "MYSTRATEGIES_FLAG"


class CountingMirrored(MirroredStrategy):
    created = 0

    def __init__(self, **options):
        super().__init__(**options)
        type(self).created += 1


class FlaggedMultiWorker(MultiWorkerMirroredStrategy):
    traits = dataclasses.replace(MultiWorkerMirroredStrategy.traits, env={FLAG: "on"})

    def __init__(self, **options):
        if os.environ.get(FLAG) != "on":
            raise RuntimeError(f"{FLAG} is not set: the launcher ignored this strategy's traits")
        super().__init__(**options)
