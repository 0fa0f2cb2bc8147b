"""The comparison report of a suite: every system's AP and AP+ per stage over seeds, Init
versus Final, cost ratios, where LOIRE's wall time goes, and a verdict on each of the
paper's claims (Tables 2, 4, 11, 12; Figs 3, 4, 6).

Two rules keep the verdicts honest:
- the sanity gate: a run whose train loss at the end of any stage is not at least
  ``margin`` nats below the unigram entropy of that stage's data learned nothing a
  unigram table would not, so it is never counted as a win or a loss;
- a verdict needs at least ``MIN_SEEDS`` counted runs of every system it compares, and it
  is "holds" only when the seeds' ranges do not overlap (every LOIRE run better than
  every run of the other system); "does not hold" when they do not overlap the other way;
  anything else is "inconclusive".

The same machinery serves decoders (LOIRE-GPT) and encoders (LOIRE-Bert): the fixed-size
baselines are GPT_L and GPT_R beside a decoder and BERT_L and BERT_R beside an encoder
(``family``), and an encoder's perplexities are masked-LM perplexities (the masked
positions of fixed validation masks), so its Init equals the previous Final just the same.

``run_result`` and the rest are pure functions of run configs and metrics records;
``write`` puts report.md, report.json and the plot on disk.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from typing import Any, Callable, Mapping, Sequence

from loire_jax import paths
from loire_jax.analysis import downstream
from loire_jax.analysis.reports import last_by, save_png, summarize
from loire_jax.analysis.tables import MIN_SEEDS, lower, markdown_table, range_text, seed_stats, stat_cell
from loire_jax.config.run import RunConfig
from loire_jax.config.stage import model_name, stage_number

# Growth "preserves the function" when Init is within this share of the previous Final on
# every growth stage: float32 rounding of an exact construction is ~1e-6 of it.
PRESERVATION_RTOL = 1e-3
PAPER_FLOPS = {"GPT_L": 76.20, "GPT_R": 70.78}  # LOIRE's FLOPs in % of each (Table 4, AVG)
# The paper's model behind each family's figures, and the model kind of each family.
PAPER_MODEL = {"GPT": "LOIRE-GPT1", "BERT": "LOIRE-Bert"}
KINDS = {"decoder": "GPT", "encoder": "BERT"}


def family(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """"BERT" if the suite's models are encoders, else "GPT": the prefix of its fixed-size
    baselines. Read from the runs' model kind, or failing that from the systems' names."""
    kinds = {r.get("kind") for runs in results.values() for r in runs} - {None}
    if kinds:
        if len(kinds) > 1:
            raise ValueError(f"a comparison of one kind of model, got {sorted(kinds)}")
        return KINDS[kinds.pop()]
    return "BERT" if any(s.startswith("BERT_") for s in results) else "GPT"


def _scratch(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> tuple[str, str]:
    """The suite's L and R baselines: GPT_L and GPT_R, or BERT_L and BERT_R."""
    fam = family(results)
    return f"{fam}_L", f"{fam}_R"


# ---------------------------------------------------------------------------- one run
def gate(run: RunConfig, records: Sequence[Mapping[str, Any]], entropy: Mapping[str, float],
         margin: float) -> dict[str, Any]:
    """The sanity gate of one run: each stage's end train loss (LM loss, mean of the last
    tenth of its steps) against the unigram entropy of the stage's domain, in nats."""
    train = last_by(records, "train", ("stage", "step"))
    rows = []
    for k, stage in enumerate(run.stages):
        n, number = max(1, stage.steps // 10), stage_number(k)
        losses = [train[number, s]["lm_loss"] for s in range(stage.steps - n + 1, stage.steps + 1)
                  if (number, s) in train]
        scored = [x for x in losses if x is not None]  # None: a step with no masked token has no loss
        end = statistics.fmean(scored) if len(losses) == n and scored else None
        h = entropy.get(stage.domains[0])
        rows.append({"stage": number, "domain": stage.domains[0], "end_loss": end, "unigram": h,
                     "below": None if end is None or h is None else h - end,
                     "passed": end is not None and h is not None and math.isfinite(end) and end <= h - margin})
    return {"margin": margin, "stages": rows, "passed": all(r["passed"] for r in rows)}


def breakdown(run: RunConfig, records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Where a run's wall time went, in seconds: compilation, growth (and M1's init),
    loading teachers, teacher forwards (the distillation steps' extra time over the same
    stage's other steps), the other steps, evaluation, and the rest (saves, data start-up).
    Step times come from the logged tokens/s (completion to completion, so they include
    the host's share)."""
    tokens = run.batch_size * run.seq_len
    eval_compile = sum(r["seconds"] for r in records if r.get("kind") == "compile" and r["phase"] == "eval")
    out = {"compile": sum(r["seconds"] for r in records if r.get("kind") == "compile"),
           "growth": sum(r["seconds"] for r in records if r.get("kind") == "setup" and r["what"] != "teachers"),
           "teacher_load": sum(r["seconds"] for r in records if r.get("kind") == "setup" and r["what"] == "teachers"),
           "teacher_forward": 0.0, "steps": 0.0,
           # the evaluation's compilation runs inside its timer
           "eval": sum(r["eval_s"] for r in records if r.get("kind") == "wall") - eval_compile}
    train = last_by(records, "train", ("stage", "step"))
    for k in range(len(run.stages)):
        rows = [r for (s, _), r in train.items() if s == stage_number(k) and r.get("tokens_per_s")]
        plain = [tokens / r["tokens_per_s"] for r in rows if r["phase"] != "distill"]
        distill = [tokens / r["tokens_per_s"] for r in rows if r["phase"] == "distill"]
        base = statistics.median(plain) if plain else 0.0
        extra = max(0.0, sum(distill) - base * len(distill)) if plain else 0.0
        out["teacher_forward"] += extra
        out["steps"] += sum(plain) + sum(distill) - extra
    total = sum(r["train_s"] + r["eval_s"] for r in records if r.get("kind") == "wall")
    out["other"] = total - sum(out.values())
    out["total"] = total
    return out


def run_result(run: RunConfig, records: Sequence[Mapping[str, Any]], entropy: Mapping[str, float],
               margin: float, diverged: str | None = None) -> dict[str, Any]:
    """What the comparison needs of one run: AP/AP+ per stage, Init AP after each growth
    (on the domains seen before it), cost, the gate and the wall-time breakdown. A run that
    ``diverged`` (its message) is over: it counts as finished and failing the gate."""
    s = summarize(run, records)
    n = len(run.stages)
    finished = s["totals"]["stages_finished"] == n
    pres = {p["stage"]: p for p in s["preservation"]}
    checked = gate(run, records, entropy, margin)
    if diverged:
        checked = {**checked, "passed": False, "diverged": diverged}
    return {
        "name": run.name, "kind": run.model.kind, "finished": finished or bool(diverged), "diverged": diverged,
        "AP": [row["AP"] for row in s["lifelong"]],
        "AP+": [row["AP+"] for row in s["lifelong"]],
        "init_AP": [pres[j]["init"] if j in pres else None for j in map(stage_number, range(n))],
        "previous_final_AP": [pres[j]["previous_final"] if j in pres else None for j in map(stage_number, range(n))],
        "flops": [st["flops"] for st in s["stages"]],
        "wall_s": [st["wall_s"] for st in s["stages"]],
        "gate": checked,
        "breakdown": breakdown(run, records),
    }


# ---------------------------------------------------------------------------- across seeds


def aggregate(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Per system, over its finished runs that passed the gate: mean and range of AP, AP+
    and Init AP per stage, and the mean cost per stage."""
    out = {}
    for system, runs in results.items():
        counted = [r for r in runs if r["finished"] and r["gate"]["passed"]]
        stages = max((len(r["flops"]) for r in runs), default=0)
        out[system] = {
            "runs": len(runs), "finished": sum(r["finished"] for r in runs), "counted": len(counted),
            "failed_gate": [r["name"] for r in runs if r["finished"] and not r["gate"]["passed"]],
            **{key: [seed_stats([r[key][k] if k < len(r[key]) else None for r in counted]) for k in range(stages)]
               for key in ("AP", "AP+", "init_AP", "previous_final_AP")},
            "flops": [seed_stats([r["flops"][k] for r in runs if _complete(r)]) for k in range(stages)],
            "wall_s": [seed_stats([r["wall_s"][k] for r in runs if _complete(r)]) for k in range(stages)],
        }
    return out


def _combine(parts: Sequence[str]) -> str:
    if not parts:
        return "not run"
    if "does not hold" in parts:
        return "does not hold"
    return "holds" if all(p == "holds" for p in parts) else "inconclusive"


def _final(r: Mapping[str, Any], key: str) -> float | None:
    return r[key][-1] if r[key] else None


def _mean_init(r: Mapping[str, Any]) -> float | None:
    vals = [v for v in r["init_AP"][1:] if v is not None]
    return statistics.fmean(vals) if vals and len(vals) == len(r["init_AP"]) - 1 else None


def _complete(r: Mapping[str, Any]) -> bool:
    """Finished every stage (a diverged run is over, but not complete)."""
    return r["finished"] and not r.get("diverged")


def _mean_gap(r: Mapping[str, Any]) -> float | None:
    """Mean |Init - previous Final| AP over the growth stages: what growth itself changed."""
    pairs = list(zip(r["init_AP"][1:], r["previous_final_AP"][1:]))
    if not pairs or any(a is None or b is None for a, b in pairs):
        return None
    return statistics.fmean(abs(a - b) for a, b in pairs)


@dataclasses.dataclass(frozen=True)
class Claim:
    """One of the paper's claims: LOIRE's ``metric`` per run is compared, lower is better,
    with each of ``opponents`` (None: every other system in the suite). ``check``, if given,
    is a condition on LOIRE's own runs that must hold as well, whatever the opponents do:
    it returns whether it holds and the number behind it. A claim with a ``check`` and
    ``contrast`` opponents is about LOIRE alone: the check decides it, and the opponents
    the suite has are compared as well (a suite with none of them still gets the verdict).
    ``paper_model``: whose figures ``paper`` quotes."""

    claim: str
    where: str
    paper: str
    label: str
    metric: Callable[[Mapping[str, Any]], float | None]
    opponents: tuple[str, ...] | None
    check: Callable[[Sequence[Mapping[str, Any]]], tuple[bool, str]] | None = None
    contrast: bool = False
    paper_model: str = "LOIRE-GPT1"


def _total(r: Mapping[str, Any], key: str) -> float | None:
    """A run's total of a per-stage cost (``flops``, ``wall_s``), None if a stage lacks it."""
    values = r.get(key) or []
    return float(sum(values)) if values and all(v is not None for v in values) else None


def _exact_growth(loire: Sequence[Mapping[str, Any]]) -> tuple[bool, str]:
    """Every growth stage of every run: Init within PRESERVATION_RTOL of the previous Final."""
    pairs = [(abs(a - b), b) for r in loire for a, b in zip(r["init_AP"][1:], r["previous_final_AP"][1:])]
    exact = all(gap <= PRESERVATION_RTOL * prev for gap, prev in pairs)
    return exact, (f"LOIRE's largest gap {max(gap for gap, _ in pairs):.3g} AP (tolerance {PRESERVATION_RTOL:g} of "
                   "the previous Final)")


CLAIMS = (
    Claim("LOIRE forgets least: the lowest AP+ of all systems", "Table 2", "AP+ -3.84 vs 3.13 (ELLE) to 83.25",
          "final AP+", lambda r: _final(r, "AP+"), None),
    Claim("LOIRE forgets less than ELLE, the strongest lifelong rival", "Table 2 (vs ELLE)", "AP+ -3.84 vs 3.13",
          "final AP+", lambda r: _final(r, "AP+"), ("ELLE",)),
    Claim("LOIRE costs less wall time than LiGO", "Table 4 (vs LiGO)", "28h48m vs 48h25m wall",
          "total wall time, s", lambda r: _total(r, "wall_s"), ("LiGO",), paper_model="LOIRE-Bert"),
    Claim("LOIRE costs fewer FLOPs than LiGO", "Table 4 (vs LiGO, FLOPs)", "not reported: the paper compares "
          "wall time", "total training FLOPs", lambda r: _total(r, "flops"), ("LiGO",), paper_model="LOIRE-Bert"),
    Claim("the plug-in layer beats layer-stack", "Fig. 6, Table 11", "final AP 19.19 vs 62.64",
          "final AP", lambda r: _final(r, "AP"), ("Layer-stack",)),
    Claim("the hidden -> ffn -> heads -> layers schedule beats its reverse", "Table 7/11", "final AP 19.19 vs 22.23",
          "final AP", lambda r: _final(r, "AP"), ("SCHL-Reverse",)),
    Claim("iterative KD beats single KD and memory-only", "Table 12", "final AP+ -3.84 vs 4.86 and 5.35",
          "final AP+", lambda r: _final(r, "AP+"), ("Single-KD", "Memory")),
    Claim("exact growth (Init = previous Final) beats random and zero initialisation", "Fig. 4",
          "Init AP and AP+ far lower", "Init AP after growth, mean over stages 2-5", _mean_init, ("Random", "Zero")),
    Claim("growth preserves the function: Init equals the previous Final", "Table 2 (bottom), Fig. 4",
          "Init within 0.09-0.76 PPL of the previous Final", "abs(Init - previous Final) AP, mean "
          "over stages 2-5", _mean_gap, ("Random", "Zero"), check=_exact_growth, contrast=True,
          paper_model="LOIRE-Bert"),
)


def _paper(figures: str, model: str, fam: str) -> str:
    """The paper's figures, naming the model they are of where it is not the suite's kind."""
    return figures if model == PAPER_MODEL[fam] else f"{figures} ({model})"


def verdicts(results: Mapping[str, Sequence[Mapping[str, Any]]],
             downstream_tasks: Sequence[str] = ()) -> list[dict[str, Any]]:
    """A verdict for each claim, with the numbers behind it; the downstream claims (Tables 5
    and 11) when the suite fine-tuned on ``downstream_tasks``."""
    def counted(system: str) -> list[Mapping[str, Any]]:
        return [r for r in results.get(system, ()) if r["finished"] and r["gate"]["passed"]]

    out = []
    fam = family(results)
    loire = counted("LOIRE")
    # LOIRE's runs that failed the gate are not dropped in its favour: they make every verdict inconclusive
    loire_failed = [r["name"] for r in results.get("LOIRE", ()) if r["finished"] and not r["gate"]["passed"]]
    for c in CLAIMS:
        others = [s for s in results if s != "LOIRE"] if c.opponents is None else list(c.opponents)
        present = [s for s in others if s in results]
        if c.contrast and c.check is not None:  # LOIRE's own check decides; the opponents are a contrast
            missing, others = "LOIRE" not in results, present
        else:
            missing = "LOIRE" not in results or not others or len(present) < len(others)
        mine = [v for v in (c.metric(r) for r in loire) if v is not None]
        parts, numbers, worse = [], [f"LOIRE {range_text(mine)}"], []
        for other in present:
            theirs = [v for v in (c.metric(r) for r in counted(other)) if v is not None]
            parts.append(lower(mine, theirs))
            numbers.append(f"{other} {range_text(theirs)}")
            if parts[-1] == "does not hold":
                worse.append(other)
        if c.check is not None and not missing:
            if len(mine) >= MIN_SEEDS:
                ok, number = c.check(loire)
                numbers.append(number)
                parts.append("holds" if ok else "does not hold")
                if not ok:
                    worse.append("its own check")
            else:
                parts.append("inconclusive")
        if c.contrast and len(present) < len(c.opponents or ()):
            numbers.append(f"{', '.join(s for s in c.opponents or () if s not in present)}: not in this suite")
        verdict = "not run" if missing else _combine(parts)
        why = _why(verdict, loire, others, counted, checked_only=c.check is not None and not others, worse=worse)
        if loire_failed and verdict != "not run":
            verdict, why = "inconclusive", f"LOIRE run(s) {', '.join(loire_failed)} failed the sanity gate"
        out.append({"claim": c.claim, "where": c.where, "paper": _paper(c.paper, c.paper_model, fam),
                    "metric": c.label, "verdict": verdict, "numbers": numbers, "why": why})
    out.insert(1, _flops_verdict(results, counted))
    if downstream_tasks:
        out += downstream.verdicts(results, downstream_tasks)
    return out


def _why(verdict: str, loire: Sequence, others: Sequence[str], counted, checked_only: bool = False,
         worse: Sequence[str] = ()) -> str:
    """Why a claim got its verdict. ``worse``: the opponents whose every counted run beat
    every LOIRE run ("its own check" when LOIRE's check failed): a verdict that does not
    hold names them, even where another opponent has too few counted runs."""
    if verdict == "not run":
        return "a system it needs is not in this suite"
    if verdict == "does not hold" and worse and not checked_only:
        beaten = [w for w in worse if w != "its own check"]
        parts = [f"every counted run of {', '.join(beaten)} is better than every LOIRE run"] if beaten else []
        if "its own check" in worse:
            parts.append("LOIRE's growth was not exact on every growth stage")
        return "; ".join(parts)
    short = [s for s in ["LOIRE", *others] if len(counted(s) if s != "LOIRE" else loire) < MIN_SEEDS]
    if short:
        return f"fewer than {MIN_SEEDS} counted runs of {', '.join(short)} (runs that failed the gate do not count)"
    if checked_only:  # LOIRE's own runs decide, with no opponent in the suite
        return ("LOIRE's own runs decide: within the tolerance on every growth stage of every seed"
                if verdict == "holds" else "LOIRE's own runs decide: not within the tolerance on every growth stage")
    if verdict == "inconclusive":
        return "the seeds' ranges overlap"
    return "the seeds' ranges do not overlap"


def _flops_verdict(results, counted) -> dict[str, Any]:
    """Table 4: LOIRE's training FLOPs over GPT_L's and GPT_R's (an encoder's: BERT_L's and
    BERT_R's), summed over the stages (analytic, so every seed gives the same ratio; the seed
    rule applies all the same). Each ratio is a claim of its own: the suite's verdict covers
    those of the two baselines it has (bert-mini has BERT_L only), and names them. The
    paper's figures are LOIRE-GPT1's."""
    parts, numbers = [], []
    loire = counted("LOIRE")
    fam, scratch = family(results), _scratch(results)
    present = [s for s in scratch if s in results]
    for other, paper in zip(scratch, PAPER_FLOPS.values()):
        if other not in results:
            continue
        theirs = counted(other)
        if not loire or not theirs:
            parts.append("inconclusive")
            continue
        ratios = [sum(a["flops"]) / sum(b["flops"]) for a in loire for b in theirs]
        numbers.append(f"LOIRE/{other} {100 * statistics.fmean(ratios):.1f}% (paper {paper:.1f}%"
                       + ("" if fam == "GPT" else f", {PAPER_MODEL['GPT']}") + ")")
        if len(loire) < MIN_SEEDS or len(theirs) < MIN_SEEDS:
            parts.append("inconclusive")
        else:
            parts.append("holds" if max(ratios) < 1 else "does not hold")
    if present and len(present) < len(scratch):
        numbers.append(f"{', '.join(s for s in scratch if s not in present)}: not in this suite")
    verdict = "not run" if not present or "LOIRE" not in results else _combine(parts)
    why = ("a system it needs is not in this suite" if verdict == "not run" else
           f"fewer than {MIN_SEEDS} counted runs" if "inconclusive" in parts else "analytic FLOPs of the runs")
    return {"claim": f"LOIRE costs fewer FLOPs than {' and '.join(present or scratch)}", "where": "Table 4",
            "paper": _paper("76.2% and 70.8%", PAPER_MODEL["GPT"], fam), "metric": "total training FLOPs ratio",
            "verdict": verdict, "numbers": numbers, "why": why}


def cost_ratios(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """LOIRE's FLOPs and wall time over GPT_L's and GPT_R's (BERT_L's and BERT_R's), per
    stage and in total (means over the finished runs of both, seed by seed where both have
    the seed)."""
    out = []
    mine = {r["name"].rsplit("-s", 1)[-1]: r for r in results.get("LOIRE", ()) if _complete(r)}
    for other in _scratch(results):
        theirs = {r["name"].rsplit("-s", 1)[-1]: r for r in results.get(other, ()) if _complete(r)}
        seeds = sorted(set(mine) & set(theirs))
        if not seeds:
            continue
        row: dict[str, Any] = {"versus": other, "seeds": len(seeds)}
        for key in ("flops", "wall_s"):
            n = len(mine[seeds[0]][key])
            row[key] = {
                "per_stage": [statistics.fmean(mine[s][key][k] / theirs[s][key][k] for s in seeds) for k in range(n)],
                "total": statistics.fmean(sum(mine[s][key]) / sum(theirs[s][key]) for s in seeds)}
        out.append(row)
    return out


# ---------------------------------------------------------------------------- the report
def markdown(suite: Mapping[str, Any], results: Mapping[str, Sequence[Mapping[str, Any]]],
             sweep: Sequence[Mapping[str, Any]] = ()) -> str:
    """The whole report as markdown. ``suite`` carries name, seeds, setting, why, margin and
    entropy; ``sweep`` rows carry setting, system, final_ap, gate_passed."""
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
    lines += markdown_table(["the paper's claim", "where", "paper", "measured", "verdict"],
                    [[v["claim"], v["where"], v["paper"], f"{v['metric']}: " + "; ".join(v["numbers"]),
                      f"**{v['verdict']}** ({v['why']})"] for v in verdicts(results, tasks)])
    lines += ["", f"A verdict needs {MIN_SEEDS} counted runs of each system it compares; it is \"holds\" only "
              "when no seed's value of the other system is as low as any of LOIRE's.", ""]
    stages = max((len(a["AP"]) for a in agg.values()), default=0)
    lines += ["## AP and AP+ per stage (Table 2, Fig. 3)", ""]
    header = ["system", "runs"] + [f"{model_name(k)} {m}" for k in range(stages) for m in ("AP", "AP+")]
    lines += markdown_table(header, [[s, f"{a['counted']}/{a['runs']}"] + [stat_cell(a[m][k]) for k in range(stages)
                                                                 for m in ("AP", "AP+")] for s, a in agg.items()])
    lines += ["", "## Init versus Final (Fig. 4; Table 2's bottom rows)", "",
              "Init: the AP of the grown model right after growth, on the domains seen before it; Final: "
              "the previous stage's final AP on the same domains. Exact growth makes them equal.", ""]
    header = ["system"] + [f"{model_name(k)} {m}" for k in range(1, stages) for m in ("Init", "prev. Final")]
    lines += markdown_table(header, [[s] + [stat_cell(a[m][k]) for k in range(1, stages)
                                    for m in ("init_AP", "previous_final_AP")] for s, a in agg.items()])
    lines += downstream.section(results, tasks) if tasks else []
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
        lines += [f"LOIRE and {' or '.join(_scratch(results))} have no finished runs with a common seed."]
    lines += ["", "## Where the wall time goes", "",
              "Seconds per run, mean over finished runs. Teacher forwards: the distillation steps' time beyond "
              "the same stage's other steps; other: checkpoints, data start-up and bookkeeping.", ""]
    parts = ("compile", "growth", "teacher_load", "teacher_forward", "steps", "eval", "other", "total")
    rows = []
    for s, runs in results.items():
        done = [r["breakdown"] for r in runs if _complete(r)]
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
                         "finished" if r["finished"] else "not finished",
                         f"{min(below):.3f}" if below else "-", "pass" if r["gate"]["passed"] else "**fail**"])
    lines += markdown_table(["system", "run", "state", "min nats below unigram", "gate"], rows)
    if sweep:
        lines += ["", "## Hyperparameter sweep", "",
                  f"One shared setting for every system, chosen on {', '.join(sorted({r['system'] for r in sweep}))}"
                  " at a seed the comparison does not use; final AP and the gate per run.", ""]
        lines += markdown_table(["setting", "system", "final AP", "gate"],
                        [[" ".join(r["setting"]), r["system"],
                          f"{r['final_ap']:.2f}" if r.get("final_ap") is not None else "-",
                          "pass" if r.get("gate_passed") else "fail"] for r in sweep])
    return "\n".join(lines) + "\n"


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


def write(out: paths.Path, suite: Mapping[str, Any], results: Mapping[str, Sequence[Mapping[str, Any]]],
          sweep: Sequence[Mapping[str, Any]] = ()) -> paths.Path:
    """report.md, report.json and ap_by_stage.png in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    paths.write_atomic(out / "report.md", markdown(suite, results, sweep))
    paths.write_atomic(out / "report.json", json.dumps(
        {"suite": suite, "runs": results, "aggregate": aggregate(results),
         "verdicts": verdicts(results, suite.get("downstream_tasks") or ()),
         "cost": cost_ratios(results), "sweep": list(sweep)}, indent=1, default=str))
    save_png(figure(results), out / "ap_by_stage.png")
    return out
