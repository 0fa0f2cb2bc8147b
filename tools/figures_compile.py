"""The compile-time figures: GPT_L against LOIRE with the persistent cache off, into an empty
one and warm, read from ``bench_compile.py``'s recorded table and summary line (the README's
Performance section quotes the summary's ratios too).

Loaded from its file by docs_figures.py after figures_text.py (tools is no package: the
imports below find it by name).
"""

from __future__ import annotations

import re

from figures_text import Got, cmd, duration, on, prose

from loire_jax.analysis.tables import markdown_table


def compile_rows(stdout: str) -> dict[tuple[str, str], tuple[str, ...]]:
    """bench_compile.py's table: (system, pass) -> (programs, compile s, tracing s, wall s, FLOPs)."""
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0] in ("GPT_L", "LOIRE"):
            rows[cells[0], cells[1]] = tuple(cells[2:])
    if len(rows) != 6:
        raise ValueError(f"bench_compile's table has {len(rows)} of its 6 rows")
    return rows


def compile_ratios(stdout: str) -> dict[str, str]:
    """bench_compile.py's summary line, as printed: LOIRE / GPT_L per pass, warm / cold per system."""
    found = re.search(r"^LOIRE / GPT_L compile: (\S+) cache off, (\S+) empty cache, (\S+) warm cache; "
                      r"warm / cold: GPT_L (\S+), LOIRE (\S+);", stdout, re.M)
    if not found:
        raise ValueError("bench_compile's summary line is missing")
    keys = ("cache off", "empty cache", "warm cache", "GPT_L warm", "LOIRE warm")
    return {k: v.replace("x", "×") for k, v in zip(keys, found.groups())}


def fig_bench_compile(got: Got) -> str:
    rec = got("bench-compile")
    rows = compile_rows(rec["stdout"])
    passes = ("cache off", "empty cache", "warm cache")
    table = markdown_table(("compile s (of which tracing)", *passes),
                           [[system, *(f"{rows[system, p][1]} ({rows[system, p][2]})" for p in passes)]
                            for system in ("GPT_L", "LOIRE")])

    ratios = compile_ratios(rec["stdout"])

    def ratio(p: str) -> str:
        return ratios[p]

    def warm(system: str) -> str:
        return ratios[f"{system} warm"]

    return prose(
        f"{cmd(rec)} ({duration(rec['record']['wall_s'])} {on(rec)}; `docs/results/bench-compile`): GPT_L and "
        f"LOIRE derived from the default run's config, 20 steps a stage, each compiling {rows['LOIRE', 'cache off'][0]} "
        f"programs over five stages (a training step and an evaluation per stage). LOIRE / GPT_L compile time: "
        f"{ratio('cache off')} with the cache off, {ratio('empty cache')} into an empty cache (GPT_L's five stages "
        f"share one shape, so stages 2–5 load stage 1's programs), {ratio('warm cache')} warm. A warm rerun's compile "
        f"time is {warm('LOIRE')} of the cold one for LOIRE and {warm('GPT_L')} for GPT_L; tracing, which no cache "
        "saves, is most of what is left:"
    ) + "\n" + "\n".join(table) + "\n"
