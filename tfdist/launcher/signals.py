"""How the launcher's main thread takes SIGTERM (preemption) and SIGINT (Ctrl-C) while it
supervises a job (`tfdist.launcher.supervisor.Supervisor.run`): while tasks start, as exceptions
raised at once; while it watches them, noted and raised between polls."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


class Preempted(Exception):
    """The launcher received SIGTERM."""


def _raise_preempted(signum: int, frame: FrameType | None) -> None:
    raise Preempted


_pending_signals: list[int] = []
"""SIGTERM / SIGINT received while `signals_between_polls` held them, oldest first."""


def _note_signal(signum: int, frame: FrameType | None) -> None:
    _pending_signals.append(signum)


def raise_pending_signal() -> None:
    """Raises what the first signal held by `signals_between_polls` means, if one came."""
    if _pending_signals:
        signum = _pending_signals[0]
        _pending_signals.clear()
        raise Preempted if signum == signal.SIGTERM else KeyboardInterrupt


@contextlib.contextmanager
def signals_between_polls() -> Iterator[None]:
    """Inside, SIGTERM and SIGINT are only noted, and `raise_pending_signal` raises them where
    the watch loop calls it, between polls; on the way out, one noted and not raised yet is.

    An exception raised by a signal handler can land anywhere, such as inside
    ``Popen.poll()`` between taking its wait lock and the ``try`` that releases it; the stop
    that follows then waits for that lock forever (a CI run of 2026-11-28: a preempted
    launcher silent for 120 s after its tasks had saved). Applies where `sigterm_is_preemption`
    installed its handlers (the main thread, `Supervisor.run`); elsewhere it changes nothing.
    """
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not _raise_preempted):
        yield
        return
    _pending_signals.clear()
    previous = {signum: signal.signal(signum, _note_signal)
                for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    raise_pending_signal()


@contextlib.contextmanager
def ignoring(signum: int) -> Iterator[None]:
    """Ignores ``signum`` inside (in the main thread; elsewhere signals cannot be handled)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signum, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signum, previous)


@contextlib.contextmanager
def sigterm_is_preemption() -> Iterator[None]:
    """SIGTERM raises `Preempted` in the main thread (elsewhere signals cannot be handled);
    SIGINT raises ``KeyboardInterrupt`` even where the launcher was started with it ignored (a
    script's background job inherits SIG_IGN): a SIGINT sent to the launcher stops the job."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_preempted)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
