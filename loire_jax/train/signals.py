"""Signals: how a run stops cleanly and resumably (SIGTERM from a scheduler, Ctrl-C).

A run-session concern, not storage: a signal only decides *when* the trainer saves and
stops; the checkpoint module only knows how to save. ``PreemptionGuard`` turns SIGTERM into
a flag polled at step boundaries; ``RunSignals`` covers SIGTERM and SIGINT for a whole run
and raises ``Stopped`` outside the step loop, where nothing half-done is worth saving.
With several processes every decision is agreed across them (one small all-gather), so all
of them save the same step and stop at the same point.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any, Iterable

import jax
import numpy as np

from loire_jax.errors import INTERRUPTED, RESUME


class PreemptionGuard:
    """Turns SIGTERM into a flag the training loop polls: save, then exit cleanly.

    Why a signal flag rather than Orbax's ``reached_preemption``: that needs
    ``jax.distributed`` initialised (a coordinator port even for one process), and it
    is always False otherwise, silently. A handler that only sets a flag works on any
    backend and leaves the decision (save with ``force=True``, ``wait``, exit) to the
    loop at a step boundary. With several processes, ``should_stop`` agrees across them
    so every host saves the same step.
    """

    def __init__(self, signals: Iterable[int] = (signal.SIGTERM,)) -> None:
        self._signals = tuple(signals)
        self._event = threading.Event()
        self._previous: dict[int, Any] = {}
        self.signum: int | None = None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        self._event.set()  # only a flag: no I/O inside a signal handler

    def __enter__(self) -> "PreemptionGuard":
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("PreemptionGuard must be entered in the main thread (Python signal rule)")
        for s in self._signals:
            self._previous[s] = previous = signal.signal(s, self._handler)
            # A signal the command's start-up handler recorded (cli.startup) is taken over: it
            # came before this guard, and must stop the run as if it came now.
            received = getattr(previous, "received", None)
            if received is not None:
                previous.received = None
                if not self.requested:
                    self.signum = received
                    self._event.set()
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, prev in self._previous.items():
            signal.signal(s, prev)
        self._previous.clear()

    @property
    def requested(self) -> bool:
        """True once a preemption signal arrived (on this process)."""
        return self._event.is_set()

    def should_stop(self) -> bool:
        """``requested`` on any process; one collective per call when multi-process."""
        return self.agreed_signal() is not None

    def agreed_signal(self) -> int | None:
        """The signal any process received (the highest number if several did), or None.

        Every process gets the same answer from the same call, so all of them stop at the
        same point; the ones not signalled adopt the signal, and exit as if they got it."""
        if jax.process_count() == 1:
            return self.signum if self.requested else None
        from jax.experimental import multihost_utils

        mine = (self.signum or signal.SIGTERM) if self.requested else 0
        got = int(np.max(multihost_utils.process_allgather(np.array(mine, dtype=np.int32))))
        if got:
            self.signum = self.signum or got
            self._event.set()
        return got or None


class Stopped(BaseException):
    """A SIGTERM or SIGINT outside the step loop: nothing in flight to save, stop now.

    A ``BaseException``, like ``KeyboardInterrupt``: the ``except Exception`` blocks that map
    library errors (a damaged step, an unavailable dataset) must never swallow a stop."""

    def __init__(self, signum: int, where: str | None = None):
        self.signum, self.where = signum, where
        super().__init__(signal.Signals(signum).name)


def exit_code_for(signum: int | None) -> int:
    """130 for Ctrl-C (SIGINT); ``RESUME`` (75) for any other stop."""
    return INTERRUPTED if signum == signal.SIGINT else RESUME


def stop_within(err: BaseException) -> Stopped | None:
    """The ``Stopped`` a library wrapped in an error of its own, if any: a signal that lands
    while a C extension initialises comes back as that extension's ``ImportError``
    ("initialization failed", its cause our ``Stopped``), which is still a stop, not a bug."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, Stopped):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


class RunSignals(PreemptionGuard):
    """SIGTERM and SIGINT for the whole run, so that every stop is clean and resumable.

    Inside ``deferred()`` (the step loop, whose saves must never be cut) a signal only sets
    the flag: the loop saves at the next step boundary and returns. Anywhere else (data
    preparation, growth, compilation, evaluation) there is nothing half-done worth saving,
    so the handler raises ``Stopped`` at once; what was done is on disk, and the next run
    redoes the rest (a missing stage evaluation included).
    """

    def __init__(self) -> None:
        super().__init__((signal.SIGTERM, signal.SIGINT))
        self._defer = 0

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        self._event.set()
        if not self._defer:
            raise Stopped(signum)

    def __enter__(self) -> "RunSignals":
        super().__enter__()
        if self.requested and not self._defer and jax.process_count() == 1:
            # taken over from start-up: stop before anything starts (several processes stop
            # at their first agreed point instead, all together)
            signum = self.signum
            self.__exit__()
            raise Stopped(signum, "start-up")
        return self

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "signal"

    @property
    def exit_code(self) -> int:
        """``RESUME`` (75) for SIGTERM, a scheduler's time limit or preemption notice: saved, not
        done, so a batch script requeues it (exit 0 would read as a finished run); 130 for Ctrl-C."""
        return exit_code_for(self.signum)

    def deferred(self) -> "_Deferred":
        return _Deferred(self)


class _Deferred:
    def __init__(self, owner: RunSignals) -> None:
        self.owner = owner

    def __enter__(self) -> RunSignals:
        self.owner._defer += 1
        return self.owner

    def __exit__(self, *exc: Any) -> None:
        self.owner._defer -= 1
