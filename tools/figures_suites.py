"""The comparison suites' figures: paper-mini's and bert-mini's verdicts, judged anew from the
recorded runs by today's rule, their per-system tables and downstream Tables 5 and 6, and what
each suite cost.

Loaded from its file by docs_figures.py after figures_text.py (tools is no package: the
imports below find it by name).
"""

from __future__ import annotations

import re
from typing import Any

from figures_text import Got, cmd, duration, on, prose

from loire_jax.analysis.tables import markdown_table
from loire_jax.analysis.tables import stat_cell as cell


def _suite_rows(suite: dict[str, Any]) -> list[str]:
    """Per system: counted runs, M1 and M5 AP, M5 AP+ (the report's cells) and mean FLOPs."""
    rows = []
    for system, a in suite["aggregate"].items():
        flops = [st["mean"] for st in a["flops"] if st]
        rows.append([system, f"{a['counted']}/{a['runs']}", cell(a["AP"][0]), cell(a["AP"][-1]), cell(a["AP+"][-1]),
                     f"{sum(flops):.3g}"])
    return markdown_table(("system", "counted runs", "M1 AP", "M5 AP", "M5 AP+", "training FLOPs"), rows)


def _windowed(suite: dict[str, Any]) -> list[str]:
    """The systems that keep LOIRE's recovery window (``System.window``, as the code is now)."""
    from loire_jax.experiments.suite import windowed_systems

    return windowed_systems()


def _verdict_rows(suite: dict[str, Any], *, numbers: bool, ran_only: bool = False) -> list[str]:
    """The verdicts judged anew from the recorded runs (``analysis.comparison.verdict_section``),
    so the docs show today's rule on the record's numbers, with what each verdict tests: every
    claim under both readings of the recovery window (a claim whose runs of a reading the
    record lacks says so). Without ``numbers`` (README's), one compact table; ``ran_only``:
    no row of a claim the suite could not run (a suite of few systems, as the docs say)."""
    from loire_jax.analysis.comparison import verdict_section

    return verdict_section(suite["runs"], suite["suite"].get("downstream_tasks") or (), _windowed(suite),
                           numbers=numbers, compact=not numbers, ran_only=ran_only)


def _finetune_seconds(stdout: str) -> list[float]:
    """Each of a suite's downstream fine-tunings' seconds, from its ``done in N s`` lines: the
    whole suite's ``[downstream i/n] RUN TASK``; one planned item's ``[item I] RUN TASK`` (a
    worker beside the command, ``--index``; its runs' lines name no task); ``[side downstream
    ...]`` in older records."""
    return [float(x) for x in re.findall(r"^\[(?:(?:side )?downstream \d+/\d+\] .*|item \d+\] \S+ \S+): done in (\d+) s;",
                                          stdout, re.M)]


def _suite_wall(rec: dict[str, Any], short: bool = False) -> str:
    n = sum(len(runs) for runs in rec["suite"]["runs"].values()) + len(rec["suite"]["sweep"])
    tunes = _finetune_seconds(rec["stdout"] + rec.get("side_stdout", ""))
    what = f"{n} runs" + (f" and {len(tunes)} fine-tunings" if tunes else "")
    beside = rec["record"].get("beside")
    out = f"{cmd(rec)} ran {what} in **{duration(rec['record']['wall_s'])}** {on(rec)}"
    if not short:
        out += ", into an empty workdir and an empty compilation cache, with the corpus already prepared"
    if beside and short:
        beside = "with a second worker running some of its items beside the command"
    out += f" (one measurement{'; ' + beside if beside else ''})"
    if tunes and not short:  # README's verdicts: the total only
        tunes.sort()
        total = duration(sum(tunes))
        out += (f". The fine-tunings took {total} in all, the two processes' seconds added: " if beside else
                f". The downstream part took {total} of it: ")
        out += f"{tunes[len(tunes) // 2]:.0f} s a fine-tuning at the median, {tunes[-1]:.0f} s at most"
    return out


def _table5_rows(suite: dict[str, Any], family: str = "GPT") -> list[str]:
    """The report's Table 5 rows (``analysis.downstream.table``), from the suite's report; an
    encoder suite's (``family`` "BERT") are Table 6's, with each task's trivial baseline."""
    from loire_jax.analysis.downstream import table

    tasks = suite["suite"].get("downstream_tasks") or []
    if not tasks:
        return []
    paper = "paper GLUE average" if family == "BERT" else "paper average"
    return markdown_table(("system", "counted runs", *tasks, "average", paper),
                          table(suite["runs"], tasks, baselines=family == "BERT", family=family))


def fig_paper_mini(got: Got) -> str:
    rec = got("paper-mini")
    suite = rec["suite"]["suite"]
    table5 = _table5_rows(rec["suite"])
    downstream = ("\nDownstream (Table 5): validation accuracy of the final models, fine-tuned at each run's seed "
                  "(`downstream:` in the suite):\n\n" + "\n".join(table5) + "\n" if table5 else "")
    return prose(
        f"{_suite_wall(rec)}. The sweep chose `{' '.join(suite['setting'])}` ({suite['why']}). Its report "
        "(`docs/results/paper-mini/report.md`), over seeds " + ", ".join(map(str, suite["seeds"])) + ":"
    ) + "\n" + "\n".join(_verdict_rows(rec["suite"], numbers=True)) + "\n\n" + "\n".join(
        _suite_rows(rec["suite"])) + "\n" + downstream


def fig_bert_mini(got: Got) -> str:
    """bert-mini's record: what it cost, its verdicts judged anew by today's rule, its systems and
    Table 6 (every final model fine-tuned) beside the paper's GLUE averages. No sweep: every
    system runs the base config's setting (the suite's ``about`` says why)."""
    from loire_jax.analysis.downstream import beside_paper

    rec = got("bert-mini")
    report = rec["suite"]
    seeds = ", ".join(map(str, report["suite"]["seeds"]))
    out = prose(f"{_suite_wall(rec)}. Its report (`docs/results/bert-mini/report.md`), over seeds {seeds}:")
    out += "\n" + "\n".join(_verdict_rows(report, numbers=True, ran_only=True)) + "\n\n" + "\n".join(
        _suite_rows(report)) + "\n"
    table6 = _table5_rows(report, family="BERT")
    if table6:
        tasks = report["suite"]["downstream_tasks"]
        out += "\n" + prose(
            "Table 6 at CPU scale: validation accuracy of each counted run's final model, fine-tuned at the run's "
            "seed on " + " and ".join(f"`{t}`" for t in tasks) + " (mean ± half the range; †: not above the "
            "task's trivial baseline, the last row). The paper's column is its GLUE average, a different "
            "benchmark at a different scale:") + "\n" + "\n".join(table6) + "\n"
        if sentence := beside_paper(report["runs"], tasks, "BERT"):
            out += "\n" + prose(sentence)
    return out


def fig_paper_mini_verdicts(got: Got) -> str:
    from loire_jax.analysis.comparison import judged_readings
    from loire_jax.analysis.readings import view

    rec = got("paper-mini")
    size = judged_readings(rec["suite"]["runs"], rec["suite"]["suite"].get("downstream_tasks") or (),
                           _windowed(rec["suite"]))["family_size"]
    names, systems = rec["suite"]["runs"], view(rec["suite"]["runs"], "end")  # the systems, no reading's own rows
    rows = f" ({len(names)} rows with their `start` readings)" if len(names) > len(systems) else ""
    counts = sorted({len(runs) for runs in rec["suite"]["runs"].values()})
    seeds = f"{counts[0]} seeds each" if len(counts) == 1 else f"{counts[0]} to {counts[-1]} seeds a system"
    return prose(
        f"The paper's comparisons at CPU scale (`--suite paper-mini`: {len(systems)} systems{rows}, its two "
        f"rivals ELLE and LiGO among them, derived from `configs/mini.yaml`, {seeds}): "
        f"{_suite_wall(rec, short=True)}. Each verdict pairs LOIRE with each opponent seed by seed, "
        f"under each reading of the recovery window (a paired t interval, Bonferroni over {size} claims a "
        "column; *no material effect* inside a margin; †: computed or not the paper's, outside that family); "
        "the numbers: [docs/results.md](docs/results.md#paper-mini-and-how-to-read-its-report)."
        + ("" if "Memory-ER-replay" in rec["suite"]["runs"] else
           " This record predates today's replay-matched systems and SCHL-Reverse: its LOIRE-ER-replay and "
           "LOIRE-ELLE-replay replayed the rival's number of old-data windows through LOIRE's own window, not the "
           "rival's batches, and its SCHL-Reverse reversed the whole order; the rows' words are today's, until "
           "paper-mini is recorded anew.")
    ) + "\n" + "\n".join(_verdict_rows(rec["suite"], numbers=False)) + "\n"
