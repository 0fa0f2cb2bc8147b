"""The comparison report of a suite: every system's AP and AP+ per stage over seeds, Init
versus Final, cost ratios, where LOIRE's wall time goes, and a verdict on each of the
paper's claims (Tables 2, 4, 11, 12; Figs 3, 4, 6).

This module renders them: what each run measured is ``suite_results``'s, the claims and
their verdicts ``claims``'s. ``markdown`` and ``figure`` are pure; ``write`` puts
report.md, report.json and the plot on disk.
"""

from __future__ import annotations

import json
import statistics
from typing import Any, Mapping, Sequence

from loire_jax import paths
from loire_jax.analysis import claims, downstream, paper_figures, readings
from loire_jax.analysis.claims import PAPER_FLOPS, PAPER_MODEL, claims_judged, verdicts
from loire_jax.analysis.paired import ALPHA
from loire_jax.analysis.report_plots import save_png
from loire_jax.analysis.reports import report_folder
from loire_jax.analysis.suite_results import aggregate, complete, cost_ratios, family, scratch_baselines
from loire_jax.analysis.tables import MIN_SEEDS, markdown_table, stat_cell
from loire_jax.config.stage import model_name, stage_number


def markdown(suite: Mapping[str, Any], results: Mapping[str, Sequence[Mapping[str, Any]]],
             sweep: Sequence[Mapping[str, Any]] = ()) -> str:
    """The whole report as markdown. ``suite`` carries name, seeds, setting, why, margin and
    entropy, and where the suite computed them ``vocabulary_overlap`` (Fig. 2) and
    ``attention`` (Fig. 5); ``sweep`` rows carry setting, system, final_ap, gate_passed."""
    agg = aggregate(results)
    fam = family(results)
    lines = [f"# Comparison suite `{suite['name']}`", "",
             f"Seeds {', '.join(map(str, suite['seeds']))}. Shared setting: "
             f"`{' '.join(suite['setting']) or 'the base config'}` ({suite['why']}). Cells are the mean ± half "
             "the range over the counted runs (finished, and passed the sanity gate).", ""]
    if fam == "BERT":
        lines += ["Encoders (LOIRE-Bert): every perplexity is a masked-LM perplexity, exp of the mean cross-entropy "
                  "over the masked positions of fixed validation masks (the same positions for every model), and "
                  "the train loss of the sanity gate is the masked-LM loss.", ""]
    lines += ["## Verdicts", ""]
    tasks = suite.get("downstream_tasks") or ()
    lines += verdict_section(results, tasks, suite.get("windowed"), numbers=True)
    lines += [""]
    stages = max((len(a["AP"]) for a in agg.values()), default=0)
    lines += _ap_table(agg, stages)
    lines += ["", "## Init versus Final (Fig. 4; Table 2's bottom rows)", "",
              "Init: the AP of the grown model right after growth, on the domains seen before it; Final: "
              "the previous stage's final AP on the same domains. Exact growth makes them equal.", ""]
    header = ["system"] + [f"{model_name(k)} {m}" for k in range(1, stages) for m in ("Init", "prev. Final")]
    lines += markdown_table(header, [[s] + [stat_cell(a[m][k]) for k in range(1, stages)
                                    for m in ("init_AP", "previous_final_AP")] for s, a in agg.items()])
    lines += downstream.section(results, tasks, fam) if tasks else []
    lines += ["", "## Cost (Table 4)", ""]
    ratios = cost_ratios(results)
    if ratios:
        header = ["ratio", "seeds"] + [model_name(k) for k in range(len(ratios[0]["flops"]["per_stage"]))] + ["total"]
        rows = []
        for r in ratios:
            for key, label in (("flops", "FLOPs"), ("wall_s", "wall time")):
                rows.append([f"LOIRE/{r['versus']} {label}", str(r["seeds"])]
                            + [f"{100 * x:.1f}%" for x in r[key]["per_stage"]] + [f"{100 * r[key]['total']:.1f}%"])
        lines += markdown_table(header, rows)
        lines += ["", f"The paper ({PAPER_MODEL['GPT']}): LOIRE/GPT_L {PAPER_FLOPS['GPT_L']}% and LOIRE/GPT_R "
                  f"{PAPER_FLOPS['GPT_R']}% of the FLOPs (Table 4, AVG)."]
    else:
        lines += [f"LOIRE and {' or '.join(scratch_baselines(results))} have no finished runs with a common seed."]
    lines += ["", "## Where the wall time goes", "",
              "Seconds per run, mean over finished runs. Teacher forwards: the distillation steps' time beyond "
              "the same stage's other steps; other: checkpoints, data start-up and bookkeeping.", ""]
    parts = ("compile", "growth", "teacher_load", "teacher_forward", "steps", "eval", "other", "total")
    rows = []
    for s, runs in results.items():
        done = [r["breakdown"] for r in runs if complete(r)]
        if done:
            rows.append([s] + [f"{statistics.fmean(b[p] for b in done):.1f}" for p in parts])
    lines += markdown_table(["system", *parts], rows)
    lines += ["", "## Sanity gate", "",
              f"A run counts only if, at the end of every stage, its train loss (mean of the stage's last tenth of "
              f"steps) is at least {suite['margin']} nats below the unigram entropy of the stage's domain "
              "(" + ", ".join(f"{d} {h:.3f}" for d, h in suite["entropy"].items()) + " nats). The table gives the "
              "smallest margin over the stages.", ""]
    rows = []
    for s, runs in results.items():
        for r in runs:
            below = [g["below"] for g in r["gate"]["stages"] if g["below"] is not None]
            rows.append([s, r["name"], "diverged" if r.get("diverged") else
                         f"failed (exit {r['failed'].get('code', '?')})" if r.get("failed") is not None else
                         "finished" if r["finished"] else "not finished",
                         f"{min(below):.3f}" if below else "-", "pass" if r["gate"]["passed"] else "**fail**"])
    lines += markdown_table(["system", "run", "state", "min nats below unigram", "gate"], rows)
    lines += _made_section(results)
    lines += ["", *paper_figures.overlap_section(suite.get("vocabulary_overlap")),
              *paper_figures.attention_section(suite.get("attention"))]
    if sweep:
        lines += ["", "## Hyperparameter sweep", "",
                  f"One shared setting for every system, chosen on {', '.join(sorted({r['system'] for r in sweep}))}"
                  " at a seed the comparison does not use; final AP and the gate per run.", ""]
        lines += markdown_table(["setting", "system", "final AP", "gate"],
                        [[" ".join(r["setting"]), r["system"],
                          f"{r['final_ap']:.2f}" if r.get("final_ap") is not None else "-",
                          "pass" if r.get("gate_passed") else "fail"] for r in sweep])
    return "\n".join(lines) + "\n"


def _made_section(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """Where each run was made (its ``made.json``: host, device, commit, date), those made on
    another device kind than most marked, and each failed run's line: a suite's runs may
    come from several machines (``loire-experiment --merge``)."""
    runs = [(s, r) for s, rs in results.items() for r in rs]
    if not any(r.get("made") or r.get("failed") for _, r in runs):
        return []
    kinds = [r["made"]["device_kind"] for _, r in runs if (r.get("made") or {}).get("device_kind")]
    common = max(set(kinds), key=kinds.count) if kinds else None
    rows = []
    for s, r in runs:
        made, notes = r.get("made") or {}, []
        kind = made.get("device_kind")
        if common and kind and kind != common:
            notes.append(f"**another device** (most runs: {common})")
        if made.get("merged_from"):
            notes.append(f"merged from {made['merged_from']}")
        if r.get("failed") is not None:
            notes.append(f"failed (exit {r['failed'].get('code', '?')}): {r['failed'].get('error', '')}")
        device = f"{kind} x {made['devices']}" if kind and made.get("devices") else (kind or "-")
        rows.append([s, r["name"], made.get("host") or "-", device, str(made.get("commit") or "-")[:12],
                     str(made.get("finished") or "-"), "; ".join(notes)])
    return ["", "## Where the runs were made", "",
            "Each run's host, devices and commit when it finished (its `made.json`; `-` where it was not recorded).",
            ""] + markdown_table(["system", "run", "host", "device", "commit", "finished", "note"], rows)


def judged_readings(results: Mapping[str, Sequence[Mapping[str, Any]]], tasks: Sequence[str],
                    windowed: Sequence[str] | None) -> dict[str, Any]:
    """``readings.both_readings`` given the ``windowed`` systems, where the record ran any of them
    under ``start``; else ``end`` alone. A suite of one reading (``readings: [end]``, bert-mini's)
    gets no ``start`` column of "not in this record" rows: ``one_reading`` says it was not run."""
    if windowed is not None and readings.windowed_in(results):
        return readings.both_readings(results, tasks, windowed)
    end = readings.view(results, "end")
    return {"end": verdicts(end, tasks), "family_size": claims_judged(end, tasks), "outside": claims.family_outside(end),
            "one_reading": windowed is not None}


def verdict_section(results: Mapping[str, Sequence[Mapping[str, Any]]], tasks: Sequence[str],
                    windowed: Sequence[str] | None, *, numbers: bool, compact: bool = False,
                    ran_only: bool = False) -> list[str]:
    """The verdict tables: the claims in the Bonferroni family, then the rows outside it, and
    the note. Given the ``windowed`` systems (those that keep LOIRE's recovery window), each
    claim is judged under both readings, a verdict column each (``readings``); without them,
    under ``end`` alone. ``numbers``: with the paired numbers behind each verdict (the
    ``end`` reading's). ``compact`` (README's): one table, the rows outside the family last
    and marked †, no note, and no row the suite ran under neither reading (the full tables
    list those). ``ran_only``: the full tables without those rows (a suite of few systems)."""
    judged = judged_readings(results, tasks, windowed)
    columns = [r for r in readings.READINGS if r in judged]
    header = ["the paper's claim (where)", "paper", "what it tests", *(("measured",) if numbers else ()),
              *(f"verdict, recovery: {r}" for r in columns)]

    def rows(outside: bool) -> list[list[str]]:
        return [[f"{v['claim']} ({v['where']}){' †' if compact and outside else ''}", v["paper"], v.get("tests", ""),
                 *((": ".join([v["metric"], "; ".join(v["numbers"])] if v["numbers"] else [v["metric"]]),)
                   if numbers else ()),
                 *(f"**{judged[r][i]['verdict']}** ({judged[r][i]['why']})" if numbers else
                   f"**{judged[r][i]['verdict']}**" for r in columns)]
                for i, v in enumerate(judged["end"]) if v["outside"] == outside
                and not ((compact or ran_only) and all(judged[r][i]["verdict"] == "not run" for r in columns))]

    if compact:
        return markdown_table(header, rows(False) + rows(True))
    lines = markdown_table(header, rows(False))
    if outside := rows(True):
        lines += ["", "Outside the family (computed, not measured, or not a claim of the paper: no interval "
                  "to share the error rate with):", ""] + markdown_table(header, outside)
    return lines + ["", verdict_note(judged["family_size"], judged["outside"], len(columns),
                                     one_reading=judged.get("one_reading", False))]


def verdict_note(family_size: int, outside: int = 0, columns: int = 1, *, one_reading: bool = False) -> str:
    """The report's footnote on how its verdicts are judged (docs/results.md#verdicts).
    ``one_reading``: the suite ran every system under ``recovery: end`` alone, and says so."""
    note = (f"Each claim pairs LOIRE with each opponent seed by seed (the same seed, the same stage-1 model): the "
            f"differences LOIRE - opponent at the seeds with a counted run of both (at least {MIN_SEEDS}), their "
            "mean, how many favour LOIRE, and a paired Student t interval. **no material effect**: the interval lies "
            f"inside the claim's margin (±{claims.PPL_MARGIN.absolute:g} perplexity point for AP, AP+ and Init AP, "
            f"±{downstream.SCORE_MARGIN.absolute:g} point for downstream scores, {100 * claims.WALL_MARGIN.relative:g}% of "
            f"the opponent's wall time, {100 * claims.FLOPS_MARGIN.relative:g}% of its FLOPs); **holds** / **reversed**: "
            "it lies wholly on "
            "LOIRE's better / worse side of zero; else **inconclusive**. A claim holds only if it holds against "
            f"every opponent, and is reversed if reversed against any. {family_size} claims are judged at once: "
            f"Bonferroni at a family-wise {ALPHA:g}, each claim's share {ALPHA:g}/{family_size} split evenly over "
            "its opponents, which sets each interval's level.")
    if outside:
        note += (f" {outside} row(s) stand outside the family, judged as a point against the margin: computed, not "
                 f"measured (the same at every seed), or not a claim of the paper; inside it, the family would be "
                 f"{family_size + outside}.")
    if columns > 1:
        note += (f" Every claim is judged under both readings of the recovery window, by the same rules and the "
                 f"same family of {family_size} in each column (`start`: each system that keeps LOIRE's window "
                 "run with it right after growth, the others the same runs); each column keeps its family-wise "
                 f"{ALPHA:g}, the two together at most {2 * ALPHA:g}.")
    if one_reading:
        note += (" Every claim is judged under `recovery: end` alone: this suite ran no system with LOIRE's window "
                 "right after growth (`readings: [end, start]` in the suite's config runs both, and judges each "
                 "claim under each).")
    return note


def _ap_table(agg: Mapping[str, Any], stages: int) -> list[str]:
    """AP and AP+ per stage, with the old-data tokens each system replayed beside them."""
    lines = ["## AP and AP+ per stage (Table 2, Fig. 3)", "",
             "Replay: the old-data tokens each run trained on over all its stages (windows of the earlier "
             "domains' recovery memory; a LOIRE run's own domain's memory in a `recovery: end` window not "
             "counted), the same at every seed.", ""]
    header = ["system", "runs", "replay"] + [f"{model_name(k)} {m}" for k in range(stages) for m in ("AP", "AP+")]
    return lines + markdown_table(header, [[s, f"{a['counted']}/{a['runs']}", _tokens(a.get("replay_tokens"))]
                                           + [stat_cell(a[m][k]) for k in range(stages) for m in ("AP", "AP+")]
                                           for s, a in agg.items()])


def _tokens(st: Mapping[str, Any] | None) -> str:
    """A token count for the table: 10.2k, 1.3M."""
    if st is None:
        return "-"
    n = st["mean"]
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else f"{n:.0f}"


def figure(results: Mapping[str, Sequence[Mapping[str, Any]]]):
    """AP and AP+ per stage for every system, mean with the seeds' range (Fig. 3)."""
    import matplotlib
    from matplotlib.figure import Figure  # outside pyplot: the caller's backend and figures are left alone

    agg = aggregate(results)
    fig = Figure(figsize=(12, 4.5))
    axes = fig.subplots(1, 2)
    colors = matplotlib.colormaps["tab20"].colors
    for ax, key in zip(axes, ("AP", "AP+")):
        for i, (system, a) in enumerate(agg.items()):
            pts = [(stage_number(k), st) for k, st in enumerate(a[key]) if st is not None]
            if not pts:
                continue
            xs = [k for k, _ in pts]
            line, = ax.plot(xs, [st["mean"] for _, st in pts], marker="os^vD<>ph*"[i % 10], label=system,
                            color=colors[(2 * i) % 20 + (i // 10) % 2], linewidth=2.5 if system == "LOIRE" else 1.2)
            ax.fill_between(xs, [st["min"] for _, st in pts], [st["max"] for _, st in pts], alpha=0.15,
                            color=line.get_color())
        ax.set_xlabel("stage")
        ax.set_ylabel(key)
        ax.set_xticks([stage_number(k) for k in range(max((len(a[key]) for a in agg.values()), default=1))])
    axes[0].set_yscale("log")
    if axes[1].get_legend_handles_labels()[0]:
        axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def _judged(results: Mapping[str, Sequence[Mapping[str, Any]]], suite: Mapping[str, Any]) -> Any:
    """Every claim under each reading the suite ran (``judged_readings``), where the suite names
    its windowed systems (else None: a record older than the readings)."""
    if suite.get("windowed") is None:
        return None
    return judged_readings(results, suite.get("downstream_tasks") or (), suite["windowed"])


def write(out: paths.Path, suite: Mapping[str, Any], results: Mapping[str, Sequence[Mapping[str, Any]]],
          sweep: Sequence[Mapping[str, Any]] = ()) -> paths.Path:
    """report.md, report.json and ap_by_stage.png in ``out`` (made and marked; a folder the
    report did not make is refused, as ``reports.report_folder`` says), and vocab_overlap.png
    (Fig. 2) and attention.png (Fig. 5) where ``suite`` carries their data."""
    out = report_folder(out, {"report.md", "report.json", "ap_by_stage.png", "vocab_overlap.png", "attention.png"},
                        {"suite", "runs", "verdicts"})
    paths.write_atomic(out / "report.md", markdown(suite, results, sweep))
    paths.write_atomic(out / "report.json", json.dumps(
        {"suite": suite, "runs": results, "aggregate": aggregate(results),
         "verdicts": verdicts(readings.view(results, "end"), suite.get("downstream_tasks") or ()),
         "readings": _judged(results, suite),
         "cost": cost_ratios(results), "sweep": list(sweep)}, indent=1, default=str))
    save_png(figure(results), out / "ap_by_stage.png")
    if suite.get("vocabulary_overlap"):
        save_png(paper_figures.overlap_figure(suite["vocabulary_overlap"]), out / "vocab_overlap.png")
    if suite.get("attention"):
        save_png(paper_figures.attention_figure(suite["attention"]), out / "attention.png")
    return out
