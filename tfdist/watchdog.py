"""The deadline of a step's collectives: one watchdog thread per process, not one per collective.

A collective op given a ``timeout`` starts a timer, and TensorFlow's timer is a thread that sleeps
for the whole timeout (``Env::SchedClosureAfter``), whether the op takes a microsecond or not. A
tensor-parallel step runs dozens of collectives, so per-op timeouts kept thousands of sleeping
threads alive (a Transformer of 2 blocks at T=2: 109 -> 8,516 threads per process in 5 epochs,
and a 4-process job died with ``std::system_error: Resource temporarily unavailable``). Collectives
inside a traced step therefore run without a timeout (`tfdist.parallel.mappings`), and
`StepWatchdog` holds the deadline instead: `StepDeadline`, a Keras callback `TensorModel` adds to
``fit``, ``evaluate`` and ``predict``, arms it when a batch starts and disarms it when the batch
ends (a function's first batch, which traces it, gets the start-up deadline if longer). A batch
that runs past the deadline (a peer died or stopped) has its collectives aborted
(``abort_collective_ops``): the step fails with an error naming the deadline, instead of waiting
forever. The pipeline's stop vote after each step (`tfdist.resilience.pipeline_vote`) holds its
deadline the same way.

Example:
    >>> watchdog = StepWatchdog(30.0, "tensor group of 2", first_seconds=600.0)
    >>> watchdog.arm(first=True); watchdog.armed
    True
    >>> watchdog.disarm(); watchdog.armed
    False
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import keras

from tfdist.errors import STEP_DEADLINE_MARKER

__all__ = ["StepDeadline", "StepWatchdog", "TENSOR_FIX", "deadline_class", "with_deadline"]

TENSOR_FIX = "raise TensorStrategy(timeout_seconds=...) if a step is that slow."
POLL_SECONDS = 0.5
"""How often the watchdog thread looks at the clock while a batch runs."""


class StepWatchdog:
    """Aborts this process's collectives when a batch runs longer than ``seconds``.

    Args:
        seconds: The deadline of one batch.
        group: What the step waits for, for the message (e.g. ``"tensor group of 2"``).
        first_seconds: The deadline of a function's first batch, which also traces and compiles
            it (default: ``seconds``).
        fix: The end of the message: what to do (default: the tensor strategy's option).
    """

    def __init__(self, seconds: float, group: str, first_seconds: float | None = None,
                 fix: str = TENSOR_FIX) -> None:
        self.seconds, self.group, self.fix = float(seconds), group, fix
        self.first_seconds = max(self.seconds, float(first_seconds or 0.0))
        self._limit = self.seconds
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired = False

    @property
    def armed(self) -> bool:
        return self._deadline is not None

    def arm(self, first: bool = False) -> None:
        """Starts the clock of one batch (``first``: a function's first) and, the first time,
        the thread."""
        with self._lock:
            self._limit = self.first_seconds if first else self.seconds
            self._deadline = time.monotonic() + self._limit
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="tfdist-step-watchdog",
                                                daemon=True)
                self._thread.start()
        self._wake.set()

    def disarm(self) -> None:
        """The batch ended in time."""
        with self._lock:
            self._deadline = None

    def _watch(self) -> None:
        while True:
            self._wake.wait()
            with self._lock:
                deadline = self._deadline
                if deadline is None:
                    self._wake.clear()
                    continue
                expired = time.monotonic() >= deadline
                if expired:
                    self._deadline = None
            if expired:
                self._abort()
            else:
                time.sleep(min(POLL_SECONDS, max(deadline - time.monotonic(), 0.0)))

    def _abort(self) -> None:
        from tensorflow.python.eager import context
        from tensorflow.python.framework import errors

        self.fired = True
        message = (f"{STEP_DEADLINE_MARKER} of {self._limit:g} s waiting for "
                   f"its {self.group} (a process of the group died, stopped or is stuck); its "
                   f"collectives are aborted. Fix: look at the other processes' output, or "
                   f"{self.fix}")
        print(message, file=sys.stderr, flush=True)
        context.context().abort_collective_ops(errors.DEADLINE_EXCEEDED, message)


class _DeadlineHooks:
    """`StepDeadline`'s hooks, for either Keras's ``Callback``."""

    def __init__(self, watchdog: StepWatchdog) -> None:
        super().__init__()
        self.watchdog = watchdog
        self._ran: set[str] = set()  # the modes whose function has run (is traced)

    def _arm(self, mode: str) -> None:
        self.watchdog.arm(first=mode not in self._ran)

    def _disarm(self, mode: str) -> None:
        self.watchdog.disarm()
        self._ran.add(mode)

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._arm("train")

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._disarm("train")

    def on_test_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._arm("test")

    def on_test_batch_end(self, batch: int, logs: Any = None) -> None:
        self._disarm("test")

    def on_predict_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._arm("predict")

    def on_predict_batch_end(self, batch: int, logs: Any = None) -> None:
        self._disarm("predict")


class StepDeadline(_DeadlineHooks, keras.callbacks.Callback):
    """Arms ``watchdog`` around every train, test and predict batch (Keras 3; `deadline_class`
    gives tf-keras's)."""


_CLASSES: dict[str, type] = {"keras": StepDeadline}


def deadline_class(keras_module: Any = keras) -> type:
    """`StepDeadline` for ``keras_module`` (Keras 3, or tf-keras, whose ``fit`` takes only its
    own callbacks).

    Example:
        >>> deadline_class() is StepDeadline
        True
    """
    name = keras_module.__name__
    if name not in _CLASSES:
        _CLASSES[name] = type("StepDeadline", (_DeadlineHooks, keras_module.callbacks.Callback),
                              {"__doc__": StepDeadline.__doc__})
    return _CLASSES[name]


def with_deadline(args: tuple[Any, ...], kwargs: dict[str, Any], position: int,
                  watchdog: StepWatchdog, keras_module: Any = keras
                  ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` of ``fit``/``evaluate``/``predict`` with a `StepDeadline` of
    ``watchdog`` (for ``keras_module``: `deadline_class`) among the callbacks, which the caller
    passed by keyword or at ``position`` (fit: 5, evaluate: 6, predict: 4).

    Example:
        >>> args, kwargs = with_deadline((), {}, 5, StepWatchdog(30.0, "group"))
        >>> [type(c).__name__ for c in kwargs["callbacks"]]
        ['StepDeadline']
    """
    positional = len(args) > position
    given = args[position] if positional else kwargs.get("callbacks")
    if isinstance(given, keras_module.callbacks.CallbackList):  # fit's, for its validation:
        return args, kwargs  # made from fit's callbacks, which hold the deadline
    deadline = deadline_class(keras_module)
    callbacks = list(given or [])
    if not any(isinstance(c, deadline) for c in callbacks):
        callbacks.append(deadline(watchdog))
    if positional:
        return (*args[:position], callbacks, *args[position + 1:]), kwargs
    return args, {**kwargs, "callbacks": callbacks}
