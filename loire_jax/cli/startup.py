"""A SIGTERM that arrives while a command starts up (imports, config, joining the other
processes) still ends it by the contract: one line and exit ``RESUME`` (75), not a silent 143.

A scheduler's SIGTERM (a time limit, a preemption notice) can come at any moment, also in the
first seconds, before the run installs its own handlers (``train.signals.RunSignals``). Until
then Python's default kills the process without a word, and the batch script reads 143: neither
"resume me" nor "done". So the entry points call :func:`hold` before their heavy imports: it
installs a handler that only records the signal. The command honours it at its first safe
point (:func:`stop_if_signalled`: after the arguments and the config are checked, so bad input
is still reported as such), and a run that has started adopts it (``RunSignals`` takes the
recorded signal over when it installs its own handlers, and stops at its first agreed point).

75 is right here: nothing of the run was done, so nothing is lost, and the same command run
again starts (or resumes) it, which is what a requeued job does. Standard library only: this
module is imported before JAX.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

from loire_jax.errors import RESUME


class _Recorder:
    """The start-up handler: remembers the signal, does nothing else (no I/O in a handler).
    ``received`` is read by ``train.signals.PreemptionGuard`` when it takes over."""

    def __init__(self) -> None:
        self.received: int | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum


_recorder = _Recorder()


def hold() -> None:
    """Record SIGTERM from now on instead of dying of it. Only in the main thread, and only
    where SIGTERM has its default action: an inherited ``SIG_IGN`` or a handler of the
    embedding program stays."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, _recorder):
        signal.signal(signal.SIGTERM, _recorder)


def pending() -> int | None:
    """The signal received while starting up and not yet honoured, if any."""
    return _recorder.received


def stopped_line(signum: int, where: str = "before the run started") -> str:
    name = signal.Signals(signum).name
    return f"stopped by {name} {where}; nothing was done, so nothing to save: rerun the same command"


def stop_if_signalled(where: str = "before the run started") -> int | None:
    """At a safe point of start-up: if a SIGTERM came, say so in one line and return the exit
    code (``RESUME``); else None, and start-up goes on."""
    signum = pending()
    if signum is None:
        return None
    print(stopped_line(signum, where), file=sys.stderr, flush=True)
    return RESUME
