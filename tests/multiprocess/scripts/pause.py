"""The preemption scripts' pause (the test SIGTERMs the launcher while every worker waits here)
and the deadline scripts' stall."""

from __future__ import annotations

import signal
import time

PAUSE_SECONDS = 5.0


def pause_until_sigterm(seconds: float = PAUSE_SECONDS) -> bool:
    """Sleeps until this process gets SIGTERM, at most ``seconds``; whether it got one.

    The process's own Python SIGTERM handler (TensorFlow's ``PreemptionCheckpointHandler``, which
    notes the signal; the save comes at a later step) still runs: it is wrapped for the pause,
    not replaced, and restored after. The step the save lands on is the same as after the whole
    pause: the handler acts at the next step either way. Without a Python handler (none
    installed, or ``SIG_IGN``) it sleeps the whole ``seconds``.
    """
    before = signal.getsignal(signal.SIGTERM)
    if not callable(before):
        time.sleep(seconds)
        return False
    got: list[int] = []

    def note(signum: int, frame: object) -> None:
        got.append(signum)
        before(signum, frame)

    signal.signal(signal.SIGTERM, note)
    try:
        deadline = time.monotonic() + seconds
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if signal.getsignal(signal.SIGTERM) is note:
            signal.signal(signal.SIGTERM, before)
    return bool(got)


def stall(seconds: float) -> None:
    """Sleeps ``seconds`` as a stuck task, but dies at SIGTERM: TensorFlow's preemption notifier
    holds SIGTERM in a training process, so a stuck one outlived the launcher's stop by its 5 s
    grace, until SIGKILL."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    time.sleep(seconds)
