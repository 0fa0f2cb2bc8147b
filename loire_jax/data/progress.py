"""Progress of the preparation's phases that can take minutes: reading a source, training
the BPE, tokenizing a split.

Shown where the preparation's other lines go (stderr): a tqdm bar on a terminal, plain lines
elsewhere (a batch job's log, a pipe): one every ``LINE_EVERY_S`` seconds, and one when a
phase that printed any ends, so a short phase adds nothing to the preparation's own lines.
``LOIRE_PROGRESS=bar`` or ``lines`` chooses either anywhere, as for training. Sentencepiece
trains in one call into C++ that reports no count, so that phase shows its elapsed time.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

LINE_EVERY_S = 30.0
PREFIX = "[loire_jax.data]"


def bar_wanted(stream: Any = None) -> bool:
    """A bar where ``stream`` (default stderr) is a terminal or in a notebook, else lines;
    the variable ``LOIRE_PROGRESS=bar|lines`` decides instead, where set."""
    choice = os.environ.get("LOIRE_PROGRESS", "").strip().lower()
    if choice in ("bar", "lines"):
        return choice == "bar"
    stream = sys.stderr if stream is None else stream
    return bool(getattr(stream, "isatty", lambda: False)()) or "ipykernel" in sys.modules


class Phase:
    """One phase's count of ``unit`` (out of ``total`` where known; ``unit=None``: its
    elapsed time only): ``update(n)`` as work is done, ``close()`` at the end, or use it
    as a context manager. Not ``enabled``: it shows nothing."""

    def __init__(self, desc: str, total: int | None = None, unit: str | None = "documents", *,
                 enabled: bool = True, bar: bool | None = None, every_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, out: Callable[[str], Any] | None = None) -> None:
        self.desc, self.total, self.unit, self.enabled, self.clock = desc, total, unit, enabled, clock
        self.every_s = LINE_EVERY_S if every_s is None else every_s
        self.out = out or (lambda line: print(line, file=sys.stderr, flush=True))
        self.n = 0
        self.began = self.last = clock()
        self.said = False  # a line was printed: the end gets one too
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._bar: Any = None
        if enabled and (bar_wanted() if bar is None else bar):
            from tqdm import tqdm

            shape = {"bar_format": "{desc}: {elapsed} elapsed"} if unit is None else {"unit": f" {unit}"}
            self._bar = tqdm(total=total, desc=f"{PREFIX} {desc}", unit_scale=True, dynamic_ncols=True,
                             file=sys.stderr, leave=False, **shape)

    def line(self, now: float) -> str:
        """The plain line for the phase as it stands at ``now``: done, of what, elapsed, ETA."""
        from tqdm import tqdm

        spent = now - self.began
        parts = []
        if self.unit is not None and self.total:
            parts.append(f"{_amount(self.n)} of {_amount(self.total)} {self.unit} ({100 * self.n // self.total}%)")
        elif self.unit is not None:
            parts.append(f"{_amount(self.n)} {self.unit}")
        parts.append(f"{tqdm.format_interval(spent)} elapsed")
        if self.unit is not None and self.total and 0 < self.n < self.total:
            parts.append(f"ETA {tqdm.format_interval(spent * (self.total - self.n) / self.n)}")
        return f"{PREFIX} {self.desc}: " + ", ".join(parts)

    def update(self, n: int = 1) -> None:
        if not self.enabled:
            return
        with self._lock:
            self.n += n
            if self._bar is not None:
                if n:
                    self._bar.update(n)
                else:
                    self._bar.refresh()
                return
            now = self.clock()
            if now - self.last >= self.every_s:
                self.last, self.said = now, True
                self.out(self.line(now))

    def start_ticking(self, every_s: float = 1.0) -> None:
        """Keep showing the elapsed time, from a thread, until ``close()``: for a call that
        reports nothing while it runs (it must release the GIL, as sentencepiece's trainer
        does)."""
        if not self.enabled or self._ticker is not None:
            return

        def beat() -> None:
            while not self._stop.wait(min(every_s, max(self.every_s, 0.05))):
                self.update(0)

        self._ticker = threading.Thread(target=beat, name="loire-data-progress", daemon=True)
        self._ticker.start()
        self.update(0)  # shown (or, in a log, a line if one is due) from its start

    def close(self) -> None:
        if not self.enabled:
            return
        if self._ticker is not None:
            self._stop.set()
            self._ticker.join()
        self.enabled = False
        if self._bar is not None:
            self._bar.close()
        elif self.said:
            self.out(self.line(self.clock()) + ", done")

    def __enter__(self) -> "Phase":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _amount(n: float) -> str:
    """``9,999`` as it is, larger counts as tqdm shows them (``45.3k``, ``50.0M``)."""
    from tqdm import tqdm

    return tqdm.format_sizeof(n) if n >= 10_000 else f"{int(n):,}"
