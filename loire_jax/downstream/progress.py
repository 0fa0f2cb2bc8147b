"""A fine-tuning job's progress, from its first step: a tqdm bar on a terminal (as training's
``ProgressBar``), plain lines elsewhere (a batch job's log, a pipe), with an ETA either way.

A job on a CPU can take minutes an epoch, and its first score comes only after one; without
this it would print nothing for that long. Lines come after the first step (which includes
compiling), then about every ``every_s`` seconds and at the last step, each with the
steps done, the time a step takes and the time left. ``LOIRE_PROGRESS=bar`` or ``lines``
chooses either anywhere, as for training.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

from loire_jax.train.progress import bar_wanted  # the same choice as training's

__all__ = ["JobProgress", "bar_wanted", "duration"]


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 02 min``: an ETA a person reads at a glance."""
    s = int(round(max(seconds, 0.0)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class JobProgress:
    """One seed's steps ``start .. total``: ``step(done)`` after each step, ``write(line)``
    for a line that must not break the bar, ``close()`` at the end."""

    def __init__(self, label: str, start: int, total: int, log: Callable[[str], None], *, bar: bool,
                 every_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.start, self.total, self.log, self.every_s, self.clock = label, start, total, log, every_s, clock
        self.began = clock()
        self.first: tuple[int, float] | None = None  # (step, time) once the first step (compilation) is done
        self.last_line = -float("inf")
        self._bar: Any = None
        if bar and total > start:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=start, desc=label, unit="step", dynamic_ncols=True, file=sys.stdout)

    def rate(self, done: int, now: float) -> float | None:
        """Seconds a step, measured after the first step (which includes compiling)."""
        if self.first is None or done <= self.first[0]:
            return None
        return (now - self.first[1]) / (done - self.first[0])

    def text(self, done: int, now: float) -> str:
        rate = self.rate(done, now)
        pct = 100 * done // max(self.total, 1)
        if rate is None:
            return f"{self.label}: step {done}/{self.total} ({pct}%), first step in {duration(now - self.began)}"
        return (f"{self.label}: step {done}/{self.total} ({pct}%), {rate:.2f} s/step, "
                f"ETA {duration(rate * (self.total - done))}")

    def step(self, done: int) -> None:
        now = self.clock()
        if self.first is None:
            self.first = (done, now)
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
            return
        if done == self.first[0] or done == self.total or now - self.last_line >= self.every_s:
            self.last_line = now
            self.log(self.text(done, now))

    def write(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=sys.stdout)
        else:
            self.log(line)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
