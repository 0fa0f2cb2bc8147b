"""How the docs' figures read, the same in every family of them: durations, numbers, the
command and machine a record names, and prose wrapped as the docs wrap it.

Loaded from its file by docs_figures.py before the figure families (tools is no package:
they import it by name).
"""

from __future__ import annotations

import textwrap
from typing import Any, Callable

# What a figure renders from: a record by name (docs_figures.py's ``render`` reads each once).
Got = Callable[[str], dict[str, Any]]


def duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}".replace("-", "−")


def thousands(x: float) -> str:
    return f"{round(x):,}"


def cmd(rec: dict[str, Any]) -> str:
    return f"`{rec['record']['command']}`"


def on(rec: dict[str, Any]) -> str:
    """Where and how loaded: ``on a 2-core ... machine (load average 8.7 at the start, 19.4 at the end)``."""
    return f"on {rec['record']['machine']} (load average {rec['record']['load_average']})"


def prose(text: str) -> str:
    return textwrap.fill(text, width=90, break_on_hyphens=False, break_long_words=False) + "\n"
