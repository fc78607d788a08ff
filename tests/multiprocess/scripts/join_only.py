"""Create a MultiWorkerMirroredStrategy with a startup deadline, then report; nothing else.

Usage: ``python join_only.py SECONDS`` with TF_CONFIG and TF_USE_LEGACY_KERAS=1.
"""

from __future__ import annotations

import sys

import tfdist.strategies
from tfdist.testing import report

seconds = float(sys.argv[1])
strategy = tfdist.strategies.get_strategy("multi_worker", startup_timeout_seconds=seconds)
report({"task": str(strategy.task), "num_workers": strategy.num_workers})
