"""``python -m tfdist.bench``: see `tfdist.bench.cli`."""

import sys

from tfdist.bench.cli import main

sys.exit(main())
