"""Markdown tables and their across-seed cells, shared by the single-run report, the
comparison report and the downstream tables (one format everywhere: mean ± half the
range), and the seeds a verdict needs (the verdicts themselves: ``analysis.paired``)."""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

MIN_SEEDS = 3  # seeds with a counted run of both systems a paired verdict needs


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], *,
                   narrow_blanks: bool = False) -> list[str]:
    """A GitHub-flavoured markdown table, as lines: every table the package, the benchmarks
    and the tools write comes from here (tests/test_layout.py refuses hand-built rows).
    ``narrow_blanks`` writes an empty cell as ``| |`` instead of ``|  |`` (the benchmark
    tables and the docs' corner cells have always been written so)."""
    def line(cells: Sequence[str]) -> str:
        if narrow_blanks:
            return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"
        return "| " + " | ".join(cells) + " |"

    return [line(header), "|" + "---|" * len(header)] + [line(r) for r in rows]


def seed_stats(values: Sequence[float | None]) -> dict[str, Any] | None:
    """Mean, min, max and count of the finite values (None where there are none): the
    across-seed statistics every comparison table reports."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return None
    return {"mean": statistics.fmean(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def stat_cell(st: Mapping[str, Any] | None, digits: int = 2) -> str:
    """A table cell of ``seed_stats``: the mean, ± half the range over several runs."""
    if st is None:
        return "-"
    if st["n"] == 1:
        return f"{st['mean']:.{digits}f}"
    return f"{st['mean']:.{digits}f} ± {(st['max'] - st['min']) / 2:.{digits}f}"
