"""A Horovod script (``tfdist.horovod``) that reports its size: run under the wrong launcher."""

from __future__ import annotations

import tfdist.horovod as thvd
from tfdist.testing import report

thvd.init()
report({"size": thvd.size()})
