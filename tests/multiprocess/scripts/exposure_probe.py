"""Chief of an exposure test: waits until the ps serves, proves it answers on loopback, then waits.

Prints ``PS_PORT <port>`` and ``REACHABLE_FROM_JOB <bool>``, then sleeps until the test has
probed the port from outside the job and removed ``$PROBE_DONE``'s parent file.
"""

from __future__ import annotations

import json
import os
import socket
import time

cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
port = int(cluster["ps"][0].rsplit(":", 1)[1])
deadline, reachable = time.monotonic() + 60, False
while time.monotonic() < deadline and not reachable:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        reachable = True
    except OSError:
        time.sleep(0.2)
print(f"PS_PORT {port}", flush=True)
print(f"REACHABLE_FROM_JOB {reachable}", flush=True)
done = os.environ["PROBE_DONE"]
while not os.path.exists(done) and time.monotonic() < deadline + 60:
    time.sleep(0.1)
