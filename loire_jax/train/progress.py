"""How progress reads: the figures of a progress line, the gate and KD symbols, and the ETA.

One place formats every number a progress display prints, so no display can show a
``-0.0000`` (a KD loss of ``-1e-9`` is float noise around zero, not a signal) or spell
α as ``a``; a KD loss negative beyond rounding keeps its sign, since that is a bug worth
seeing. ``ProgressLines`` is the plain-line display for logs that are files, with an ETA.
The hooks (``train.hooks``) use this module; fine-tuning may too.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, Callable, TextIO

from loire_jax.analysis.flops import mfu_text

__all__ = ["fixed", "symbols", "train_figures", "duration", "StepRate", "ProgressLines"]

GREEK = ("α", "β")
ASCII = ("alpha", "beta")


def fixed(value: float, digits: int, *, grouping: bool = False) -> str:
    """``value`` with ``digits`` decimals (thousands separated if ``grouping``), never a
    negative zero: ``-0.0`` and a value like ``-4e-9`` that rounds to zero print unsigned."""
    text = f"{value:{',' if grouping else ''}.{digits}f}"
    if text.startswith("-") and math.isfinite(value) and float(text[1:].replace(",", "")) == 0.0:
        return text[1:]
    return text


def symbols(stream: TextIO | None, *, lines: bool) -> tuple[str, str]:
    """The names of the gate (α) and the KD weight (β) as a display writes them: the Greek
    letters where ``stream`` is a bar's terminal that can encode them, else ``alpha`` and
    ``beta``. Plain lines (log files) always spell them out, so ``grep alpha`` finds them
    and no log depends on the locale of the node that wrote it."""
    if lines or stream is None:
        return ASCII
    try:
        "".join(GREEK).encode(getattr(stream, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        return ASCII
    return GREEK


def bar_wanted() -> bool:
    """A bar on a terminal or in a notebook; plain lines in a file or a pipe. The variable
    ``LOIRE_PROGRESS=bar|lines`` decides instead, where set (training and fine-tuning alike)."""
    choice = os.environ.get("LOIRE_PROGRESS", "").strip().lower()
    if choice in ("bar", "lines"):
        return choice == "bar"
    return sys.stdout.isatty() or "ipykernel" in sys.modules


def duration(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on (as tqdm shows times)."""
    total = max(0, int(round(seconds)))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def train_figures(record: dict[str, Any], names: tuple[str, str] = ASCII) -> str:
    """A train record's figures as a progress display shows them: phase, loss, KD loss, the
    learning rate its update applied, the gate α, the KD weight β while distilling, tokens/s and MFU (``names``: how α and β are
    spelled, ``symbols``). Every number goes through ``fixed``."""
    alpha, beta = names
    if record["loss"] is None:
        losses = "loss n/a (no masked token)"
    else:
        losses = f"loss {fixed(record['loss'], 3)} kd {fixed(record['kd_loss'], 4)}"
    gates = f"{alpha} {fixed(record['alpha'], 2)}"
    if record.get("beta"):
        gates += f" {beta} {fixed(record['beta'], 2)}"
    mfu = mfu_text(record.get("mfu"), bool(record.get("mfu_approximate")))
    lr = f" lr {record['lr']:.2e}" if isinstance(record.get("lr"), (int, float)) else ""
    return (f"{record['phase']} {losses}{lr} {gates} {fixed(record['tokens_per_s'], 0, grouping=True)} tok/s "
            f"MFU {mfu}")


class StepRate:
    """Seconds per step, smoothed (an exponential moving average of the intervals between
    step records). The interval up to the first record is left out: it holds the stage's
    compilation, which later steps do not pay."""

    SMOOTHING = 0.1  # the newest interval's weight

    def __init__(self) -> None:
        self.seconds: float | None = None  # per step
        self._last: tuple[float, int] | None = None  # (time, step) of the latest record

    def step(self, step: int, now: float) -> None:
        """Step ``step``'s record arrived at time ``now`` (seconds, any origin)."""
        if self._last is not None and step > self._last[1]:
            per_step = (now - self._last[0]) / (step - self._last[1])
            self.seconds = per_step if self.seconds is None else (
                self.SMOOTHING * per_step + (1 - self.SMOOTHING) * self.seconds)
        self._last = (now, step)

    def eta(self, remaining: int) -> str:
        """The time ``remaining`` steps take at the smoothed rate; ``n/a`` before a rate exists."""
        if remaining <= 0:
            return duration(0)
        return "n/a" if self.seconds is None else duration(remaining * self.seconds)


class ProgressLines:
    """The progress of one stage as plain, periodic lines (for logs that are files): every
    ``steps // 10`` steps, the last, and at least one every ``every_s`` seconds, each with
    the ETA of the stage."""

    def __init__(self, desc: str, steps: int, every_s: float, *, clock: Callable[[], float] | None = None,
                 out: Callable[[str], Any] | None = None) -> None:
        self.desc, self.steps, self.every_s = desc, steps, every_s
        self.clock = clock or time.monotonic
        self.out = out or (lambda line: print(line, file=sys.stdout, flush=True))
        self.every = max(1, steps // 10)
        self.last = self.clock()
        self.rate = StepRate()

    def step(self, step: int, figures: str) -> None:
        now = self.clock()
        self.rate.step(step, now)
        if step % self.every and step != self.steps and now - self.last < self.every_s:
            return
        self.last = now
        self.out(f"{self.desc}: step {step}/{self.steps} ({100 * step // max(self.steps, 1)}%) {figures} "
                 f"ETA {self.rate.eta(self.steps - step)}")
