"""Rank 1 gives up with status 3 after a line on stderr; rank 0 waits (stopped, or done in 15 s)."""

import os
import sys
import time

rank = int(os.environ.get("HOROVOD_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or -1)
if rank == 1:
    print("rank 1 gives up: no data for it", file=sys.stderr, flush=True)
    sys.exit(3)
print(f"rank {rank} waits", flush=True)
time.sleep(15)  # stopped sooner: horovodrun ends the job when rank 1 fails
