"""The paper's claims and a verdict on each, from the runs of a comparison suite (Tables
2, 4, 11, 12; Figs 3, 4, 6).

A verdict needs at least ``MIN_SEEDS`` counted runs (finished, and passed the sanity gate)
of every system it compares, and it is "holds" only when the seeds' ranges do not overlap
(every LOIRE run better than every run of the other system); "does not hold" when they do
not overlap the other way; anything else is "inconclusive". A new claim is one ``Claim``
in ``CLAIMS``.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Callable, Mapping, Sequence

from loire_jax.analysis import downstream
from loire_jax.analysis.suite_results import family, scratch_baselines
from loire_jax.analysis.tables import MIN_SEEDS, lower, range_text

# Growth "preserves the function" when Init is within this share of the previous Final on
# every growth stage: float32 rounding of an exact construction is ~1e-6 of it.
PRESERVATION_RTOL = 1e-3
PAPER_FLOPS = {"GPT_L": 76.20, "GPT_R": 70.78}  # LOIRE's FLOPs in % of each (Table 4, AVG)
# The paper's model behind each family's figures.
PAPER_MODEL = {"GPT": "LOIRE-GPT1", "BERT": "LOIRE-Bert"}


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
          "final AP", lambda r: _final(r, "AP"), ("Layer-stack-open",)),  # Fig. 6's copies start open
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
    fam, scratch = family(results), scratch_baselines(results)
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
