"""What a lifelong run measured, laid out like the paper's tables (Tables 2, 4, 9, 10).

``summarize`` turns a run's config and its metrics records into one plain dict: the
perplexity matrix PPL_(t),j, AP and AP+ per stage (eq. 16), the Init/Final
function-preservation check, and per-stage cost (analytic FLOPs, measured wall time).
``compare`` adds the ratios between runs, ``markdown`` renders the tables and
``report_plots.figures`` draws the plots; those four are pure. ``write_report`` reads
workdirs and writes report.md (which links the plots), report.json and the PNGs (the CLI is
``launch/report.py``). Runs that tokenize differently are marked, never set side by side as
if their perplexities compared, and a run whose M1 was pretrained says from what
(``run_origin``).

The records are the lines of ``metrics.jsonl``. A resumed run re-logs the steps and
evaluations it redid, so the last record of each key wins, which is what the run's
checkpoints hold.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from typing import Any, Callable, Iterable, Mapping, Sequence

from loire_jax import outputs, paths
from loire_jax.analysis import downstream, paper_figures, run_origin
from loire_jax.analysis.flops import UNRECORDED, mfu_footnote, mfu_text, recorded_peaks, stage_flops
from loire_jax.analysis.metrics import lifelong_metrics, preservation
from loire_jax.analysis.records import METRICS_FILE, read_records
from loire_jax.analysis.report_plots import PLOTS, figures, save_png
from loire_jax.analysis.tables import markdown_table
from loire_jax.config.loader import run_config_from_dict
from loire_jax.config.run import RunConfig
from loire_jax.config.schedule import global_step, stage_models
from loire_jax.config.shapes import param_count
from loire_jax.config.stage import model_name, seen_domains, stage_number
from loire_jax.errors import LoireError
from loire_jax.paths import Path


def last_by(records: Iterable[Mapping[str, Any]], kind: str, key: Sequence[str]) -> dict[tuple, Mapping[str, Any]]:
    out: dict[tuple, Mapping[str, Any]] = {}
    for r in records:
        if r.get("kind") == kind:
            out[tuple(r[k] for k in key)] = r
    return out


def summarize(run: RunConfig, records: Sequence[Mapping[str, Any]], name: str | None = None) -> dict[str, Any]:
    """One run's report data. Stages without a "final" evaluation (not finished) are left out
    of the metrics but keep their planned cost."""
    models = stage_models(run)
    stage_domains = [list(s.domains) for s in run.stages]
    seen = seen_domains(stage_domains)
    evals = last_by(records, "eval", ("stage", "point", "domain"))
    train = last_by(records, "train", ("stage", "step"))

    def ppl_at(k: int, point: str) -> dict[str, float] | None:
        number = stage_number(k)
        got = {d: evals[number, point, d]["ppl"] for d in seen[k] if (number, point, d) in evals}
        return got if len(got) == len(seen[k]) else None

    def leading(point: str) -> list[dict[str, float]]:
        """PPL rows of the stages evaluated at ``point``, up to the first one that was not."""
        rows = []
        for k in range(len(run.stages)):
            if (row := ppl_at(k, point)) is None:
                break
            rows.append(row)
        return rows

    final, init = leading("final"), leading("init")

    flops = stage_flops(run, models)
    wall: dict[int, float] = {}
    eval_s: dict[int, float] = {}
    for r in records:
        if r.get("kind") == "wall":
            wall[r["stage"]] = wall.get(r["stage"], 0.0) + r["train_s"]
            eval_s[r["stage"]] = eval_s.get(r["stage"], 0.0) + r["eval_s"]
    stages, cumulative = [], 0.0
    for k, (stage, cfg) in enumerate(zip(run.stages, models)):
        cumulative += flops[k]
        number = stage_number(k)
        steps = [r for (s, _), r in sorted(train.items()) if s == number]
        rates = [r["tokens_per_s"] for r in steps[1:]]  # the first step of a session includes compilation
        mfus = [r.get("mfu") for r in steps[1:]]
        # n/a unless every timed step has an honest MFU: one above 100% (an older run's record)
        # says the CPU peak was measured too low for all of them
        honest = bool(mfus) and all(m is not None and math.isfinite(m) and 0.0 <= m <= 1.0 for m in mfus)
        stages.append({
            "stage": number, "name": stage.name, "domains": list(stage.domains),
            "growth": [f"{g.op}->{g.size}" for g in stage.growth],
            "shape": [cfg.hidden, cfg.ffn, cfg.heads, cfg.layers], "params": param_count(cfg),
            "steps": stage.steps, "steps_logged": len(steps), "finished": k < len(final),
            "flops": flops[k], "flops_cumulative": cumulative,
            "wall_s": wall.get(number), "eval_s": eval_s.get(number),
            "tokens_per_s": statistics.median(rates) if rates else None,
            "mfu": statistics.median(mfus) if honest else None,
            # over a CPU's peak (given or measured); an older run's records do not say, and count as such
            "mfu_approximate": any(r.get("mfu_approximate", True) for r in steps),
            **recorded_peaks(steps),  # "mfu_peak": where the CPU peak came from, for the footnote
        })
    finished_wall = [s["wall_s"] for s in stages if s["finished"] and s["wall_s"] is not None]
    curves = [{"stage": s, "step": i, "global_step": global_step(run, s - 1, i),
               "phase": r["phase"], "loss": r["loss"], "lm_loss": r["lm_loss"], "kd_loss": r["kd_loss"],
               "alpha": r["alpha"], "beta": r.get("beta"),
               **({"lr": r["lr"]} if isinstance(r.get("lr"), (int, float)) else {})}  # older runs logged none
              for (s, i), r in sorted(train.items())]
    return {
        "name": name or run.name,
        "domains": seen[-1],
        "stages": stages,
        "ppl": {"final": final, "init": init},
        "lifelong": lifelong_metrics(stage_domains, final),
        "preservation": preservation(stage_domains, init, final),
        "totals": {"flops": sum(s["flops"] for s in stages if s["finished"]),
                   "wall_s": sum(finished_wall) if finished_wall else None,
                   "stages_finished": len(final), "stages": len(run.stages)},
        "curves": curves,
        "stage_starts": [global_step(run, k, 0) for k in range(len(run.stages))],
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def compare(summaries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Cost of the first run relative to each other run, per stage and overall (Tables 4 and 9).

    ``mean`` averages the per-stage ratios; ``total`` is the ratio of the summed costs
    over the stages both runs finished (the two differ when stages differ in size).
    """
    base, out = summaries[0], []
    for other in summaries[1:]:
        n = min(base["totals"]["stages_finished"], other["totals"]["stages_finished"])
        row: dict[str, Any] = {"run": base["name"], "versus": other["name"], "stages": n}
        for key in ("flops", "wall_s"):
            per = [_ratio(base["stages"][k][key], other["stages"][k][key]) for k in range(n)]
            ok = [p for p in per if p is not None]
            a = [base["stages"][k][key] for k in range(n)]
            b = [other["stages"][k][key] for k in range(n)]
            total = _ratio(sum(a), sum(b)) if n and None not in a and None not in b else None
            row[key] = {"per_stage": per, "mean": sum(ok) / len(ok) if ok and len(ok) == n else None,
                        "total": total}
        out.append(row)
    return out


# ---------------------------------------------------------------------------- markdown

def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _sci(x: float | None) -> str:
    return "-" if x is None else f"{x:.3e}"



def _runs(summaries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The report's head: its runs, where a pretrained M1 came from, and whether their
    perplexities compare."""
    lines = ["# LOIRE lifelong run report", "",
             "Runs: " + ", ".join(f"`{s['name']}` ({s['totals']['stages_finished']}/{s['totals']['stages']} stages)"
                                  for s in summaries), ""]
    started = [f"`{s['name']}`: M1 started from {run_origin.pretrained_text(s['pretrained'])}, not from random "
               "weights." for s in summaries if s.get("pretrained")]
    return lines + (started + [""] if started else []) + run_origin.not_comparable_note(summaries)


def markdown(summaries: Sequence[Mapping[str, Any]], comparisons: Sequence[Mapping[str, Any]] = ()) -> str:
    """The report's tables, one section per paper table, all runs side by side."""
    n = max(len(s["stages"]) for s in summaries)
    cols = [model_name(k) for k in range(n)]
    lines = _runs(summaries)
    group, alike = run_origin.groups(summaries), run_origin.comparable(summaries)
    tag = lambda s: "" if alike else f" [{group[s['name']]}]"  # noqa: E731  (its tokenizer beside each PPL)

    lines += ["## AP and AP+ per stage (Table 2; App. D.3, eq. 16)", "",
              "AP = exp(mean_j log PPL_(t),j) over the seen domains; AP+ = mean over earlier domains of "
              "PPL_(t),j - PPL_(j,j). Lower is better for both; negative AP+ means earlier domains improved.", ""]
    header = ["run"] + [f"{c} {m}" for c in cols for m in ("AP", "AP+")]
    rows = []
    for s in summaries:
        cells = []
        for k in range(n):
            row = s["lifelong"][k] if k < len(s["lifelong"]) else None
            cells += [_f(row["AP"]) if row else "", _f(row["AP+"]) if row else ""]
        rows.append([s["name"] + tag(s)] + cells)
    lines += markdown_table(header, rows) + [""]

    lines += ["## Init / Final perplexity across growth (Table 2, bottom)", "",
              "Init: the grown model before any training, on the domains the previous model had seen; "
              "Prev final: the previous stage's final model on the same domains; Final: after the stage, on "
              "every seen domain (AP). Init = Prev final is the empirical function-preservation check.", ""]
    header = ["run", "stage", "growth", "Prev final", "Init", "Init - Prev final", "max domain |Δ|", "Final"]
    rows = []
    for s in summaries:
        for p in s["preservation"]:
            st = s["stages"][p["stage"] - 1]
            rows.append([s["name"] + tag(s), f"M{p['stage']}", ", ".join(st["growth"]) or ("(init_from)" if s.get("pretrained") else "(init)"), _f(p["previous_final"]),
                         _f(p["init"]), _f(p["delta"], 4), _f(p["max_abs_domain_delta"], 4), _f(p["final"])])
    lines += markdown_table(header, rows) + [""]

    for s in summaries:
        lines += [f"## Per-domain perplexity of `{s['name']}`{tag(s)} (Table 10)", ""]
        rows = []
        for k, ppl in enumerate(s["ppl"]["final"]):
            rows.append([f"{model_name(k)} {s['stages'][k]['name']}"] + [_f(ppl.get(d)) if d in ppl else "-"
                                                                  for d in s["domains"]])
        lines += markdown_table(["model"] + list(s["domains"]), rows) + [""]

    lines += ["## Cost per stage (Table 9)", "",
              "FLOPs: analytic training FLOPs (matmuls incl. attention, forward + backward, plus teacher "
              "forwards while distilling; `loire_jax/flops.py`). Wall: measured training time of the stage "
              "(growth, compilation, steps and checkpoints; evaluation excluded), summed over sessions.", ""]
    header = ["run", "metric"] + cols + ["total", "mean"]
    rows = []
    pad = lambda cells: cells + [""] * (n - len(cells))  # noqa: E731  (runs may differ in stage count)
    for s in summaries:
        fin = [st for st in s["stages"] if st["finished"]]
        walls = [st["wall_s"] for st in fin if st["wall_s"] is not None]
        rows.append([s["name"], "FLOPs"] + pad([_sci(st["flops"]) for st in s["stages"]])
                    + [_sci(s["totals"]["flops"]), _sci(s["totals"]["flops"] / len(fin) if fin else None)])
        rows.append([s["name"], "wall (s)"] + pad([_f(st["wall_s"] if st["finished"] else None, 1)
                                                   for st in s["stages"]])
                    + [_f(s["totals"]["wall_s"], 1), _f(sum(walls) / len(walls) if walls else None, 1)])
        rows.append([s["name"], "params"] + pad([f"{st['params']:,}" for st in s["stages"]]) + ["", ""])
        rows.append([s["name"], "tokens/s"] + pad([_f(st["tokens_per_s"], 0) for st in s["stages"]]) + ["", ""])
        rows.append([s["name"], "MFU"] + pad([mfu_text(st["mfu"], st.get("mfu_approximate", False))
                                              for st in s["stages"]]) + ["", ""])
    lines += markdown_table(header, rows) + [""]
    if any(st.get("mfu_approximate") for s in summaries for st in s["stages"]):  # where each run's CPU peak came from
        lines += [mfu_footnote({s["name"]: [o for st in s["stages"] if st.get("mfu_approximate")
                                            for o in st.get("mfu_peak", [UNRECORDED])] for s in summaries}), ""]

    if comparisons:
        lines += ["## Cost ratios (Table 4), in %", "",
                  "mean: the average of the per-stage ratios; total: the ratio of the summed costs.", ""]
        header = ["ratio", "metric"] + cols + ["mean", "total"]
        rows = []
        for c in comparisons:
            for key, label in (("flops", "FLOPs"), ("wall_s", "wall")):
                per = c[key]["per_stage"]
                pct = [_f(None if p is None else 100 * p) for p in per] + [""] * (n - len(per))
                rows.append([f"{c['run']} / {c['versus']}", label] + pct
                            + [_f(None if c[key]["mean"] is None else 100 * c[key]["mean"]),
                               _f(None if c[key]["total"] is None else 100 * c[key]["total"])])
        lines += markdown_table(header, rows) + [""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- files


class ReportError(LoireError):
    """A workdir that cannot be reported on; printed without a traceback."""


# The fields the report reads from each kind of record, and what each must be; a record
# of another kind passes as it is. "number" admits inf and NaN (json writes them).
_NUMBER, _INT, _TEXT = "number", "integer", "text"
RECORD_FIELDS: dict[str, dict[str, str]] = {
    "train": {"stage": _INT, "step": _INT, "phase": _TEXT, "loss": _NUMBER, "lm_loss": _NUMBER,
              "kd_loss": _NUMBER, "alpha": _NUMBER, "tokens_per_s": _NUMBER},
    "eval": {"stage": _INT, "point": _TEXT, "domain": _TEXT, "ppl": _NUMBER},
    "wall": {"stage": _INT, "train_s": _NUMBER, "eval_s": _NUMBER},
    "compile": {"stage": _INT, "phase": _TEXT, "seconds": _NUMBER},
    "setup": {"stage": _INT, "what": _TEXT, "seconds": _NUMBER},
}
_OPTIONAL = {"train": {"mfu": _NUMBER, "beta": _NUMBER}}  # may be absent or null
_LOSSES = ("loss", "lm_loss", "kd_loss")  # null in a train record whose tokens is 0


def _is(value: Any, kind: str) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if kind == _INT else isinstance(value, str) if kind == _TEXT \
        else isinstance(value, (int, float))


def record_problem(record: Mapping[str, Any]) -> str | None:
    """Why the report cannot use ``record`` (a field missing or of the wrong type), or None.
    A hand-edited or foreign ``metrics.jsonl`` line must not stop the report with a TypeError."""
    kind = record.get("kind")
    unscored = record.get("tokens") == 0  # a step or an evaluation that scored no token
    for name, want in RECORD_FIELDS.get(kind, {}).items():  # type: ignore[arg-type]
        if kind == "train" and unscored and name in _LOSSES and record.get(name) is None:
            continue  # a step with no masked token has no loss
        if not _is(record.get(name), want):
            return f"a {kind} record's {name} is {record.get(name)!r:.40}, not a {want}"
    for name, want in _OPTIONAL.get(kind, {}).items():  # type: ignore[arg-type]
        if record.get(name) is not None and not _is(record[name], want):
            return f"a {kind} record's {name} is {record[name]!r:.40}, not a {want}"
    if kind == "eval" and unscored:  # exp(0 / 0) read as 1.00: older runs logged it
        return "an eval record scored no token (tokens 0): its ppl is no measurement"
    if kind == "eval" and not record["ppl"] > 0:  # AP is a geometric mean: it needs positive perplexities
        return f"an eval record's ppl is {record['ppl']!r}, not positive"
    return None


def load_run(workdir: Path) -> tuple[RunConfig, list[dict[str, Any]]]:
    """(RunConfig, records) of one workdir; malformed lines (not JSON, or a record whose
    fields the report reads have the wrong type) are left out with one warning line."""
    workdir = paths.as_path(workdir)
    config, metrics = workdir / "config.json", workdir / METRICS_FILE
    if workdir.is_dir() and not (workdir / outputs.RUN).exists():  # another tool's folder: its keys are not ours
        raise ReportError(f"{workdir} is not a loire_jax run (no {outputs.RUN}, which loire-train writes in every "
                          "workdir it makes); pass the workdir of a run")
    if not config.exists() or not metrics.exists():
        raise ReportError(f"{workdir} is not a run workdir: it needs config.json and {METRICS_FILE} "
                          "(written by the trainer)")
    try:
        saved = json.loads(config.read_text())
    except ValueError as err:
        raise ReportError(f"{config} is not valid JSON ({err})") from None
    run = run_config_from_dict(saved, saved=True)
    records, bad = read_records(workdir)
    wrong = [p for p in map(record_problem, records) if p]
    if bad or wrong:
        records = [r for r in records if record_problem(r) is None]
        examples = [f"line {n}" for n in bad[:3]] + wrong[:1]
        print(f"warning: {metrics}: skipped {len(bad) + len(wrong)} malformed line(s) ({'; '.join(examples)}"
              f"{' ...' if len(bad) + len(wrong) > len(examples) else ''}); the report leaves them out",
              file=sys.stderr)
    return run, records


def write_report(workdirs: Sequence[Path], out: Path | None = None,
                 check: Callable[[RunConfig, Path], Mapping[str, Any] | None] | None = None, *,
                 checkpoint_digest: downstream.CheckpointDigest | None = None,
                 attention: Callable[[RunConfig, Path], Mapping[str, Any] | None] | None = None) -> Path:
    """Writes report.md, report.json and the PNG plots; returns the output directory.
    ``check(run, workdir)``, if given, vets each run before anything is written (the CLI
    holds its stage checkpoints against the run, a layer this one may not import), and
    returns the tokenizer identity they record, if it read one: runs are compared on it.
    ``checkpoint_digest`` (``store.checkpoints.stage_digest``) leaves out the fine-tuning
    results that scored another checkpoint than each run's current one. ``attention(run,
    workdir)`` (``experiments.attention.run_attention``, a layer above this one), if given,
    draws the first run's attention patterns from its checkpoints (Fig. 5)."""
    workdirs = [paths.as_path(w) for w in workdirs]
    summaries, runs = [], []
    for w in workdirs:
        run, records = load_run(w)
        runs.append(run)
        identity = check(run, w) if check is not None else None
        summary = summarize(run, records, name=run.name)
        summary["workdir"] = str(w)
        summary["downstream"] = downstream.run_jobs(w, checkpoint_digest)
        summary["pretrained"] = run_origin.pretrained(run, w)
        summary["tokenizer"] = run_origin.tokenizer(run, identity)
        summaries.append(summary)
    names = [s["name"] for s in summaries]
    if len(set(names)) < len(names):  # same config name twice: tell them apart by workdir
        for s, w in zip(summaries, workdirs):
            s["name"] = f"{s['name']}@{w.name}"
    if out is None:
        out = workdirs[0] / "report" if len(workdirs) == 1 else \
            paths.as_path("reports") / "_vs_".join(s["name"].replace("/", "_") for s in summaries)
    out = report_folder(out, {"report.md", "report.json", "attention.png", *(f"{p}.png" for p in PLOTS)},
                        {"runs", "comparisons"})
    maps = attention(runs[0], workdirs[0]) if attention is not None else None  # once the folder is known good
    comparisons = compare(summaries) if len(summaries) > 1 else []
    if not run_origin.comparable(summaries):  # refusing would lose the cost comparison, which holds
        print("warning: these runs tokenize differently (" + "; ".join(
            f"{s['name']}: {s['tokenizer']['text']}" for s in summaries) + "), so their perplexities are not "
            "comparable across runs; report.md marks each run's tokenizer", file=sys.stderr)
    fig5 = [] if attention is None else paper_figures.attention_section(
        maps, missing=f"Not drawn: `{summaries[0]['name']}` has no finished stage checkpoint, or its prepared stream is "
                      "not on this machine.")
    md = "\n".join([markdown(summaries, comparisons), *downstream.runs_section(summaries), *plots_section(), *fig5])
    paths.write_atomic(out / "report.md", md)
    paths.write_atomic(out / "report.json", json.dumps({"runs": summaries, "comparisons": comparisons,
                                                        "perplexities_comparable": run_origin.comparable(summaries),
                                                        **({"attention": maps} if maps else {})}, indent=1))
    for stem, fig in figures(summaries).items():
        save_png(fig, out / f"{stem}.png")
    if maps:
        save_png(paper_figures.attention_figure(maps), out / "attention.png")
    return out


def plots_section() -> list[str]:
    """report.md's links to the plots written beside it, each shown where markdown shows images."""
    return ["", "## Plots", "", *(line for stem, title in PLOTS.items() for line in (f"![{title}]({stem}.png)", ""))]


def report_folder(out: paths.PathLike, files: set[str], keys: set[str]) -> Path:
    """``out`` made and marked for a report, or ReportError before anything is written: a
    folder the report did not make is not overwritten (a user's ``report/report.md``). One an
    older version wrote (no marker) is recognised by holding only the report's ``files`` (and
    a killed write's temporaries), its ``report.json`` having ``keys``."""
    def earlier(folder: Path) -> bool:
        if not all(_written_name(p.name) in files for p in folder.iterdir()):
            return False
        try:
            saved = json.loads((folder / "report.json").read_text())
        except (OSError, ValueError):
            return False
        return isinstance(saved, dict) and keys <= set(saved)

    return outputs.claim(out, outputs.REPORT, what="report folder", error=ReportError, ours=earlier,
                         how="move what is there away, or pass another --out")


def _written_name(name: str) -> str:
    """The file a name stands for: ``report.md`` for ``.report.md.<random>.tmp``, which a
    killed ``paths.write_atomic`` leaves beside it."""
    if name.startswith(".") and name.endswith(".tmp") and name.count(".") >= 3:
        return name[1:].rsplit(".", 2)[0]
    return name

