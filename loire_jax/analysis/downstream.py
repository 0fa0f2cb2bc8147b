"""Downstream results across systems: the paper's Table 5 (task scores per system and their
average) and the verdicts on its downstream claims (Table 5: LOIRE has the best average;
Table 11: the plug-in layer beats layer-stack).

Reads what ``loire_jax.downstream.finetune`` wrote in each run directory
(``finetune/<task>/stage<k>/seed<s>/results.json``); the layout is defined here, where both
the fine-tuning job and the reports can import it. A result names the digest of the stage
checkpoint it scored; given the run's current digests (``checkpoint_digest``, which the
callers take from ``store.checkpoints.stage_digest``), a result of another checkpoint is
left out of every table and counted as stale: it is not the current model's score.

Each result also records its task's trivial baseline, computed at scoring time from the
validation examples scored (``loire_jax.downstream.baselines``): every table shows it
beside the scores and marks a score that does not clear it (``clears``, ``RULE``).
"""

from __future__ import annotations

import json
import re
import statistics
from typing import Any, Callable, Mapping, Sequence

from loire_jax import paths
from loire_jax.analysis.paired import Margin, combine, judge, pair_level, pair_text, seed_of, why
from loire_jax.analysis.tables import markdown_table, seed_stats, stat_cell
from loire_jax.errors import LoireError

FINETUNE_DIR = "finetune"
RESULTS = "results.json"

# The paper's downstream averages over its ten tasks (Table 5; Table 11 for layer-stack,
# the mean of its ten scores, whose copies the paper stacked open: Layer-stack-open), LOIRE-GPT1's.
# A downstream difference inside one accuracy point does not matter (docs/results.md#verdicts).
SCORE_MARGIN = Margin(absolute=1.0)
# Table 7's downstream half: SCHL-Reverse's mean over the same ten tasks (76.85 ... 83.12).
PAPER_AVERAGE = {"GPT_S": 81.61, "GPT_L": 82.74, "GPT_R": 83.18, "Token-KD": 81.30, "ER": 82.61, "ELLE": 83.35,
                 "LOIRE": 84.84, "Layer-stack-open": 82.91, "SCHL-Reverse": 84.24}
# Table 6: LOIRE-Bert and LiGO fine-tuned on GLUE, their "Avg. GLUE" column (LiGO's from its own paper).
PAPER_AVERAGE_BERT = {"LiGO": 81.83, "LOIRE": 86.60}
# (table, the system LOIRE is set beside, what the paper says), for the sentence under the table
PAPER_BESIDE = {"GPT": ("Table 7", "SCHL-Reverse", "SCHL-Reverse averages 84.24 over its ten tasks, LOIRE-GPT1 "
                                                   "84.84"),
                "BERT": ("Table 6", "LiGO", "LOIRE-Bert averages 86.60 over GLUE, LiGO 81.83 (LiGO's figures from "
                                            "its own paper)")}


# The rule the tables' footnotes state (``clears``), in one sentence.
RULE = ("† marks a score that is not above its task's trivial baseline (the best constant answer: the majority "
        "class, the most often right choice, or always no answer for QA) by more than the noise 2·√(p(1−p)/n) of "
        "that baseline's accuracy p over the n validation examples scored (2/√n for Matthews' coefficient): it has "
        "not shown that the model learned the task")


def clears(score: float, base: Mapping[str, Any] | None) -> bool | None:
    """Whether ``score`` is above the baseline ``base`` (as a job records it: ``score``,
    ``noise``) by more than its noise; None without a baseline (an older job's results)."""
    if not isinstance(base, Mapping) or not isinstance(base.get("score"), (int, float)):
        return None
    return score > base["score"] + float(base.get("noise") or 0.0)


def _marked(cell: str, score: float | None, base: Mapping[str, Any] | None) -> str:
    return cell + " †" if score is not None and clears(score, base) is False else cell


def _baseline_cell(bases: Sequence[Mapping[str, Any]]) -> str:
    """The baseline of a column: its score ± noise (n examples); a range where the runs
    scored different validation samples."""
    scores = sorted({round(float(b["score"]), 2) for b in bases})
    if not scores:
        return "-"
    if len(scores) > 1:
        return f"{scores[0]:.2f} to {scores[-1]:.2f}"
    b = bases[0]
    return f"{scores[0]:.2f} ± {float(b.get('noise') or 0.0):.2f} (n {b.get('n', '?')})"


def baseline_of(saved: Any) -> dict[str, Any] | None:
    """The baseline a job's results record (None in an older job's results)."""
    base = saved.get("baseline") if isinstance(saved, dict) else None
    return base if isinstance(base, dict) and isinstance(base.get("score"), (int, float)) else None


# (run_dir, stage) -> the digest of that stage's checkpoint now; raises where it has none
CheckpointDigest = Callable[[paths.Path, int], str]
_SEED = re.compile(r"seed(\d+)")
_STAGE = re.compile(r"stage(\d+)")


def scored_digest(saved: Any) -> str | None:
    """The checkpoint digest a job's results record (None in an older job's results)."""
    prov = saved.get("provenance") if isinstance(saved, dict) else None
    ck = prov.get("checkpoint") if isinstance(prov, dict) else None
    digest = ck.get("digest") if isinstance(ck, dict) else None
    return digest if isinstance(digest, str) else None


class _Current:
    """A run's current stage digests, each read once; None for a stage without a readable one."""

    def __init__(self, run_dir: paths.PathLike, digest: CheckpointDigest | None) -> None:
        self.run_dir, self.digest, self.seen = paths.as_path(run_dir), digest, {}

    def holds(self, saved: Any, stage: int) -> bool:
        """Whether ``saved`` scored the stage's current checkpoint (always, with no digest to check)."""
        if self.digest is None:
            return True
        if stage not in self.seen:
            try:
                self.seen[stage] = self.digest(self.run_dir, stage)
            except (LoireError, OSError, ValueError):
                self.seen[stage] = None  # no checkpoint left to have scored
        return self.seen[stage] is not None and scored_digest(saved) == self.seen[stage]


def job_dir(run_dir: paths.PathLike, job: str, stage: int, seed: int) -> paths.Path:
    """Where one fine-tuning job of a run lives."""
    return paths.as_path(run_dir) / FINETUNE_DIR / job / f"stage{stage}" / f"seed{seed}"


def read_scores(run_dir: paths.PathLike, tasks: Sequence[str], stage: int, seed: int,
                checkpoint_digest: CheckpointDigest | None = None) -> dict[str, float | None]:
    """Each task's final validation score of the run's stage ``stage`` at ``seed`` (None
    where that job has not finished, or scored another checkpoint than the stage's current one)."""
    current = _Current(run_dir, checkpoint_digest)
    out: dict[str, float | None] = {}
    for task in tasks:
        try:
            saved = json.loads((job_dir(run_dir, task, stage, seed) / RESULTS).read_text())
            out[task] = float(saved["score"]) if current.holds(saved, stage) else None
        except (OSError, ValueError, KeyError, TypeError):
            out[task] = None
    return out


def read_baselines(run_dir: paths.PathLike, tasks: Sequence[str], stage: int,
                   seed: int) -> dict[str, dict[str, Any] | None]:
    """Each task's baseline as the job of ``read_scores`` recorded it (None where it has none)."""
    out: dict[str, dict[str, Any] | None] = {}
    for task in tasks:
        try:
            out[task] = baseline_of(json.loads((job_dir(run_dir, task, stage, seed) / RESULTS).read_text()))
        except (OSError, ValueError):
            out[task] = None
    return out


def run_jobs(run_dir: paths.PathLike, checkpoint_digest: CheckpointDigest | None = None) -> list[dict[str, Any]]:
    """Every finished fine-tuning of a run, one entry per (job, stage): ``job``, ``stage``,
    ``metric``, ``seeds`` (seed -> final validation score) and ``baseline`` (the trivial
    baseline its current results record, if any), sorted by job and stage.
    Read from each seed's results (not the last call's summary, which holds only the seeds
    that call ran). With ``checkpoint_digest``, a result that scored another checkpoint
    than the stage's current one is left out of ``seeds`` and listed in ``stale``."""
    root = paths.as_path(run_dir) / FINETUNE_DIR
    current = _Current(run_dir, checkpoint_digest)
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for res in sorted(root.glob(f"*/stage*/seed*/{RESULTS}")) if root.exists() else ():
        stage_m, seed_m = _STAGE.fullmatch(res.parent.parent.name), _SEED.fullmatch(res.parent.name)
        if not (stage_m and seed_m):
            continue  # a job moved aside (seed1.stale-1) or not a job's folder
        job, stage, seed = res.parent.parent.parent.name, int(stage_m.group(1)), int(seed_m.group(1))
        try:
            saved = json.loads(res.read_text())
            score = float(saved["score"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a job's results: skipped, not fatal to a report
        entry = found.setdefault((job, stage), {"job": job, "stage": stage, "metric": saved.get("metric"), "seeds": {}})
        if current.holds(saved, stage):
            entry["seeds"][seed] = score
            if baseline_of(saved) is not None:
                entry.setdefault("baseline", baseline_of(saved))
        else:
            entry.setdefault("stale", []).append(seed)
    return [found[k] for k in sorted(found)]


def runs_section(summaries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The run report's downstream table (``launch/report.py``): a row per run, a column per
    fine-tuned (task, stage), each cell the mean ± half the range over the seeds fine-tuned,
    and the average over the columns where a run has them all (Table 5's layout)."""
    cols = sorted({(j["job"], j["stage"]) for s in summaries for j in s.get("downstream") or ()})
    if not cols:
        return []
    rows, bases = [], {c: [] for c in cols}
    for s in summaries:
        got = {(j["job"], j["stage"]): list(j["seeds"].values()) for j in s.get("downstream") or ()}
        base = {(j["job"], j["stage"]): j.get("baseline") for j in s.get("downstream") or ()}
        for c, b in base.items():
            if b is not None:
                bases[c].append(b)
        cells = [seed_stats(got.get(c, [])) for c in cols]
        seeds = sorted({seed for j in s.get("downstream") or () for seed in j["seeds"]})
        avg = statistics.fmean(c["mean"] for c in cells) if all(cells) else None
        rows.append([s["name"], ",".join(map(str, seeds)) or "-",
                     *(_marked(stat_cell(st), st and st["mean"], base.get(c)) for c, st in zip(cols, cells)),
                     f"{avg:.2f}" if avg is not None else "-"])
    rows.append(["trivial baseline", "-", *(_baseline_cell(bases[c]) for c in cols), "-"])
    header = ["run", "seeds", *(f"{job} (M{stage})" for job, stage in cols), "average"]
    stale = [f"{s['name']} {j['job']} (M{j['stage']}) seed {seed}" for s in summaries
             for j in s.get("downstream") or () for seed in j.get("stale", ())]
    note = ["", f"Left out: {len(stale)} result(s) that scored another checkpoint than the run's current one "
                f"({', '.join(stale[:6])}{' ...' if len(stale) > 6 else ''}); rerun `launch/finetune.py` to score the "
                "current model."] if stale else []
    return ["", "## Downstream (Table 5)", "",
            "Final validation score of each fine-tuning (`launch/finetune.py`; accuracy, or the task's metric, "
            "percent): mean ± half the range over its seeds. The average is taken over the columns where the "
            "run has every one. The last row is each task's trivial baseline on the same validation examples, "
            "± its noise.", "", *markdown_table(header, rows), "", RULE + ".", *note]


def _average(r: Mapping[str, Any], tasks: Sequence[str]) -> float | None:
    scores = (r.get("downstream") or {})
    vals = [scores.get(t) for t in tasks]
    return statistics.fmean(vals) if vals and all(v is not None for v in vals) else None


def _counted(runs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in runs if r["finished"] and r["gate"]["passed"] and r.get("downstream")]


def table(results: Mapping[str, Sequence[Mapping[str, Any]]], tasks: Sequence[str],
          baselines: bool = False, family: str = "GPT") -> list[list[str]]:
    """Rows of Table 5: system, counted runs, each task's score and the average, as mean ±
    half the range over the runs that passed the sanity gate, and the paper's average
    (Table 5's and 7's for decoders, Table 6's GLUE average for encoders: ``family``). With ``baselines``, a score that does not clear its task's baseline is marked (†) and
    a last row gives each task's baseline (``downstream_baseline`` of the runs)."""
    rows = []
    base = suite_baselines(results, tasks)
    for system, runs in results.items():
        counted = _counted(runs)
        if not any(r.get("downstream") for r in runs):
            continue
        stats = [seed_stats([(r["downstream"] or {}).get(t) for r in counted]) for t in tasks]
        cells = [_marked(stat_cell(st), st and st["mean"], base[t][0] if baselines and base[t] else None)
                 for t, st in zip(tasks, stats)]
        avgs = [a for r in counted if (a := _average(r, tasks)) is not None]
        paper = (PAPER_AVERAGE_BERT if family == "BERT" else PAPER_AVERAGE).get(system)
        rows.append([system, f"{len(counted)}/{len(runs)}", *cells, stat_cell(seed_stats(avgs)),
                     f"{paper:.2f}" if paper is not None else "-"])
    if baselines and rows:
        rows.append(["trivial baseline", "-", *(_baseline_cell(base[t]) for t in tasks), "-", "-"])
    return rows


def suite_baselines(results: Mapping[str, Sequence[Mapping[str, Any]]],
                    tasks: Sequence[str]) -> dict[str, list[Mapping[str, Any]]]:
    """Each task's baselines as the suite's runs recorded them (``downstream_baseline``)."""
    out: dict[str, list[Mapping[str, Any]]] = {t: [] for t in tasks}
    for runs in results.values():
        for r in runs:
            for t in tasks:
                b = (r.get("downstream_baseline") or {}).get(t)
                if isinstance(b, Mapping) and isinstance(b.get("score"), (int, float)):
                    out[t].append(b)
    return out


def beside_paper(results: Mapping[str, Sequence[Mapping[str, Any]]], tasks: Sequence[str],
                 family: str = "GPT") -> str | None:
    """The sentence setting the suite's LOIRE beside the system of Table 7 (decoders:
    SCHL-Reverse) or Table 6 (encoders: LiGO) as the paper does, with the averages measured
    (None where the suite fine-tuned only one of the two)."""
    where, other, paper = PAPER_BESIDE[family]
    avg = {s: seed_stats([_average(r, tasks) for r in _counted(results.get(s, ()))]) for s in ("LOIRE", other)}
    if avg["LOIRE"] is None or avg[other] is None:
        return None
    return (f"{where}: the paper's {paper}; here LOIRE averages {stat_cell(avg['LOIRE'])} and {other} "
            f"{stat_cell(avg[other])} over {len(tasks)} small task(s), not the paper's.")


def section(results: Mapping[str, Sequence[Mapping[str, Any]]], tasks: Sequence[str],
            family: str = "GPT") -> list[str]:
    """The report's Table 5 section (Table 6 for encoders: ``family`` "BERT"), as markdown lines."""
    title = "Downstream (Table 6)" if family == "BERT" else "Downstream (Table 5; Table 7; Table 11)"
    paper = "its GLUE average (Table 6)" if family == "BERT" else "its ten-task average"
    sentence = beside_paper(results, tasks, family)
    return ["", f"## {title}", "",
            "Validation score per task (accuracy, or the task's metric) of each counted run's final model "
            f"fine-tuned at the run's seed: mean ± half the range; the paper's column is {paper}. "
            "The last row is each task's trivial baseline on the same validation examples, ± its noise.", "",
            *markdown_table(["system", "runs", *tasks, "average", "paper average"],
                            table(results, tasks, baselines=True, family=family)), "", RULE + ".",
            *(["", sentence] if sentence else [])]


def _tuned(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    return [s for s, runs in results.items() if any(r.get("downstream") for r in runs)]


def _claims(results: Mapping[str, Sequence[Mapping[str, Any]]], universe: Mapping[str, Any] | None = None
            ) -> list[tuple[str, str, str, list[str], bool]]:
    """Table 5's and Table 11's claims: (claim, where, paper, opponents, not run). ``universe``:
    the systems "every other system" means (a reading's view judges against the same opponents
    as the other reading, or not at all: ``claims._opponents``)."""
    have = _tuned(results)
    every = have if universe is None else _tuned(universe)
    claims = [("LOIRE has the best downstream average", "Table 5",
               "average 84.84 vs 83.35 (ELLE), 83.18 (GPT_R) and less", [s for s in every if s != "LOIRE"]),
              ("the plug-in layer beats layer-stack downstream", "Table 11", "average 84.84 vs 82.91",
               ["Layer-stack-open"])]  # the paper stacked its copies open (App. F.1)
    return [(claim, where, paper, others, "LOIRE" not in have or not others or any(o not in have for o in others))
            for claim, where, paper, others in claims]


def claims_judged(results: Mapping[str, Sequence[Mapping[str, Any]]], tasks: Sequence[str],
                  universe: Mapping[str, Any] | None = None) -> int:
    """How many downstream claims get a verdict: they join the report's family of claims."""
    return sum(not missing for *_, missing in _claims(results, universe)) if tasks else 0


def verdicts(results: Mapping[str, Sequence[Mapping[str, Any]]], tasks: Sequence[str],
             family_size: int | None = None, universe: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Table 5's and Table 11's downstream claims, judged on the average task score per run
    (higher is better), seed by seed as every other verdict (``analysis.paired``), at the
    level of a family of ``family_size`` claims (default: these alone)."""
    avg = {s: {seed_of(r): a for r in _counted(runs) if (a := _average(r, tasks)) is not None}
           for s, runs in results.items()}
    family_size = claims_judged(results, tasks, universe) if family_size is None else family_size
    out = []
    for claim, where, paper, others, missing in _claims(results, universe):
        pairs = {} if missing else {
            o: judge(avg.get("LOIRE", {}), avg[o], lower_is_better=False, margin=SCORE_MARGIN,
                     level=pair_level(family_size, len(others))) for o in others}
        verdict = "not run" if missing else combine([p["verdict"] for p in pairs.values()])
        reason = "a system it needs has no downstream results in this suite" if missing else \
            why(verdict, pairs, subject_seeds=len(avg.get("LOIRE", {})))
        out.append({"claim": claim, "where": where, "paper": paper,
                    "metric": f"average validation score over {', '.join(tasks)}",
                    "tests": f"{len(tasks)} small task(s), not the paper's ten", "verdict": verdict,
                    "numbers": [pair_text(o, p, ".2f") for o, p in pairs.items()], "why": reason, "pairs": pairs})
    return out
