"""Calls every process of a job must make together (``save_model``, ``model.evaluate``), met in
the coordination service before any collective starts.

Each process announces its Nth call of a method (a key in the job's coordination service), then
waits for every peer's. A peer that reached the end of its script instead has announced its exit
(`announce_exit_at_exit`, `tfdist.parallel.runtime.EXIT_KEY`): the call is refused at once with
the fix, instead of failing in a collective once TensorFlow notices the peer's heartbeats have
stopped (measured under ``multi_worker``: tens of seconds; under ``pipeline``, 85 s).

Example:
    >>> every_process_calls({}, rank=0, size=1, what="model.evaluate", why="", expected="",
    ...                     fix="", limit=1.0)   # a job of one: nobody to wait for
"""

from __future__ import annotations

import atexit
import functools
import threading
import time

from tfdist.errors import StrategyConfigError, format_error
from tfdist.parallel import runtime

__all__ = ["CALL_KEY", "every_process_calls", "announce_exit_at_exit"]

CALL_KEY = "tfdist/{what}/{call}/{rank}"
"""A process's Nth call of ``what`` (``save_model``, ``model.evaluate``...), set as it starts."""
_PROBE_MS = 200
_EXIT_ANNOUNCE_S = 2.0
"""How long an exit waits for its announcement to reach the service (task 0 may be gone)."""


def every_process_calls(counts: dict[str, int], rank: int, size: int, what: str, *, why: str,
                        expected: str, fix: str, limit: float) -> None:
    """Waits until every process of the job has made this call of ``what`` (its Nth, counted
    in ``counts``, as here); raises at once when a peer announced its exit instead, or when it
    has not made the call within ``limit`` seconds.

    Raises:
        StrategyConfigError: A peer ended (or failed) before the call, or never made it.
    """
    if size < 2:
        return
    counts[what] = call = counts.get(what, 0) + 1
    runtime.announce(CALL_KEY.format(what=what, call=call, rank=rank))
    deadline = time.monotonic() + limit
    for peer in (r for r in range(size) if r != rank):
        while not runtime.announced(CALL_KEY.format(what=what, call=call, rank=peer), _PROBE_MS):
            exited = runtime.announced(runtime.EXIT_KEY.format(rank=peer), 1)
            if exited or time.monotonic() > deadline:
                raise StrategyConfigError(format_error(
                    f"{why}, but the process of rank {peer} "
                    + ("reached the end of the script (or failed) without calling it"
                       if exited else f"did not call it within {limit:g} s") + ".",
                    received=f"{what} call {call} on rank {rank} only",
                    expected=expected, fix=fix))


@functools.cache  # once per process and rank
def announce_exit_at_exit(rank: int) -> None:
    """At this process's exit (normal or not), sets its `runtime.EXIT_KEY`, waiting at most
    `_EXIT_ANNOUNCE_S` for the service (on task 0, which may have ended first)."""

    def at_exit() -> None:
        key = runtime.EXIT_KEY.format(rank=rank)
        sender = threading.Thread(target=runtime.announce, args=(key,), daemon=True,
                                  name="tfdist-exit-announce")
        sender.start()
        sender.join(_EXIT_ANNOUNCE_S)

    atexit.register(at_exit)
