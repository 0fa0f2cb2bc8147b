"""Markdown tables, their across-seed cells and the seed-range judgement, shared by the
single-run report, the comparison report and the downstream tables (one format and one
rule everywhere: mean ± half the range; a claim holds only where the seeds' ranges part)."""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

MIN_SEEDS = 3  # counted runs of each system a verdict needs


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


def lower(a: Sequence[float], b: Sequence[float]) -> str:
    """Whether the values ``a`` are lower than ``b``, by the seeds' ranges: "holds" when every
    value of ``a`` is below every value of ``b``, "does not hold" for the reverse, else (or
    with fewer than ``MIN_SEEDS`` values on a side) "inconclusive"."""
    if len(a) < MIN_SEEDS or len(b) < MIN_SEEDS:
        return "inconclusive"
    if max(a) < min(b):
        return "holds"
    if min(a) > max(b):
        return "does not hold"
    return "inconclusive"


def range_text(vals: Sequence[float], spec: str = ".4g") -> str:
    """The numbers behind a verdict: mean [min, max] (n runs), each formatted by ``spec``."""
    if not vals:
        return "no counted run"
    if len(vals) == 1:
        return f"{vals[0]:{spec}} (1 run)"
    return f"{statistics.fmean(vals):{spec}} [{min(vals):{spec}}, {max(vals):{spec}}] ({len(vals)} runs)"
