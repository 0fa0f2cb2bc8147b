"""Downstream results across systems: the paper's Table 5 (task scores per system and their
average) and the verdicts on its downstream claims (Table 5: LOIRE has the best average;
Table 11: the plug-in layer beats layer-stack).

Reads what ``loire_jax.downstream.finetune`` wrote in each run directory
(``finetune/<task>/stage<k>/seed<s>/results.json``); the layout is defined here, where both
the fine-tuning job and the reports can import it. A result names the digest of the stage
checkpoint it scored; given the run's current digests (``checkpoint_digest``, which the
callers take from ``store.checkpoints.stage_digest``), a result of another checkpoint is
left out of every table and counted as stale: it is not the current model's score.
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

# The paper's downstream averages over its ten tasks (Table 5; Table 11 for Layer-stack,
# the mean of its ten scores), LOIRE-GPT1's.
# A downstream difference inside one accuracy point does not matter (docs/results.md#verdicts).
SCORE_MARGIN = Margin(absolute=1.0)
PAPER_AVERAGE = {"GPT_S": 81.61, "GPT_L": 82.74, "GPT_R": 83.18, "Token-KD": 81.30, "ER": 82.61, "ELLE": 83.35,
                 "LOIRE": 84.84, "Layer-stack": 82.91}


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


def run_jobs(run_dir: paths.PathLike, checkpoint_digest: CheckpointDigest | None = None) -> list[dict[str, Any]]:
    """Every finished fine-tuning of a run, one entry per (job, stage): ``job``, ``stage``,
    ``metric`` and ``seeds`` (seed -> final validation score), sorted by job and stage.
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
    rows = []
    for s in summaries:
        got = {(j["job"], j["stage"]): list(j["seeds"].values()) for j in s.get("downstream") or ()}
        cells = [seed_stats(got.get(c, [])) for c in cols]
        seeds = sorted({seed for j in s.get("downstream") or () for seed in j["seeds"]})
        avg = statistics.fmean(c["mean"] for c in cells) if all(cells) else None
        rows.append([s["name"], ",".join(map(str, seeds)) or "-", *map(stat_cell, cells),
                     f"{avg:.2f}" if avg is not None else "-"])
    header = ["run", "seeds", *(f"{job} (M{stage})" for job, stage in cols), "average"]
    stale = [f"{s['name']} {j['job']} (M{j['stage']}) seed {seed}" for s in summaries
             for j in s.get("downstream") or () for seed in j.get("stale", ())]
    note = ["", f"Left out: {len(stale)} result(s) that scored another checkpoint than the run's current one "
                f"({', '.join(stale[:6])}{' ...' if len(stale) > 6 else ''}); rerun `launch/finetune.py` to score the "
                "current model."] if stale else []
    return ["", "## Downstream (Table 5)", "",
            "Final validation score of each fine-tuning (`launch/finetune.py`; accuracy, or the task's metric, "
            "percent): mean ± half the range over its seeds. The average is taken over the columns where the "
            "run has every one.", "", *markdown_table(header, rows), *note]


def _average(r: Mapping[str, Any], tasks: Sequence[str]) -> float | None:
    scores = (r.get("downstream") or {})
    vals = [scores.get(t) for t in tasks]
    return statistics.fmean(vals) if vals and all(v is not None for v in vals) else None


def _counted(runs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in runs if r["finished"] and r["gate"]["passed"] and r.get("downstream")]


def table(results: Mapping[str, Sequence[Mapping[str, Any]]], tasks: Sequence[str]) -> list[list[str]]:
    """Rows of Table 5: system, counted runs, each task's score and the average, as mean ±
    half the range over the runs that passed the sanity gate, and the paper's average."""
    rows = []
    for system, runs in results.items():
        counted = _counted(runs)
        if not any(r.get("downstream") for r in runs):
            continue
        cells = [stat_cell(seed_stats([(r["downstream"] or {}).get(t) for r in counted])) for t in tasks]
        avgs = [a for r in counted if (a := _average(r, tasks)) is not None]
        paper = PAPER_AVERAGE.get(system)
        rows.append([system, f"{len(counted)}/{len(runs)}", *cells, stat_cell(seed_stats(avgs)),
                     f"{paper:.2f}" if paper is not None else "-"])
    return rows


def section(results: Mapping[str, Sequence[Mapping[str, Any]]], tasks: Sequence[str]) -> list[str]:
    """The report's Table 5 section, as markdown lines."""
    return ["", "## Downstream (Table 5; Table 11)", "",
            "Validation score per task (accuracy, or the task's metric) of each counted run's final model "
            "fine-tuned at the run's seed: mean ± half the range; the paper's column is its ten-task average.", "",
            *markdown_table(["system", "runs", *tasks, "average", "paper average"], table(results, tasks))]


def _claims(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[tuple[str, str, str, list[str], bool]]:
    """Table 5's and Table 11's claims: (claim, where, paper, opponents, not run)."""
    have = [s for s, runs in results.items() if any(r.get("downstream") for r in runs)]
    claims = [("LOIRE has the best downstream average", "Table 5",
               "average 84.84 vs 83.35 (ELLE), 83.18 (GPT_R) and less", [s for s in have if s != "LOIRE"]),
              ("the plug-in layer beats layer-stack downstream", "Table 11", "average 84.84 vs 82.91",
               ["Layer-stack"])]
    return [(claim, where, paper, others, "LOIRE" not in have or not others or any(o not in have for o in others))
            for claim, where, paper, others in claims]


def claims_judged(results: Mapping[str, Sequence[Mapping[str, Any]]], tasks: Sequence[str]) -> int:
    """How many downstream claims get a verdict: they join the report's family of claims."""
    return sum(not missing for *_, missing in _claims(results)) if tasks else 0


def verdicts(results: Mapping[str, Sequence[Mapping[str, Any]]], tasks: Sequence[str],
             family_size: int | None = None) -> list[dict[str, Any]]:
    """Table 5's and Table 11's downstream claims, judged on the average task score per run
    (higher is better), seed by seed as every other verdict (``analysis.paired``), at the
    level of a family of ``family_size`` claims (default: these alone)."""
    avg = {s: {seed_of(r): a for r in _counted(runs) if (a := _average(r, tasks)) is not None}
           for s, runs in results.items()}
    family_size = claims_judged(results, tasks) if family_size is None else family_size
    out = []
    for claim, where, paper, others, missing in _claims(results):
        pairs = {} if missing else {
            o: judge(avg.get("LOIRE", {}), avg[o], lower_is_better=False, margin=SCORE_MARGIN,
                     level=pair_level(family_size, len(others))) for o in others}
        verdict = "not run" if missing else combine([p["verdict"] for p in pairs.values()])
        reason = "a system it needs has no downstream results in this suite" if missing else why(verdict, pairs)
        out.append({"claim": claim, "where": where, "paper": paper,
                    "metric": f"average validation score over {', '.join(tasks)}",
                    "tests": f"{len(tasks)} small task(s), not the paper's ten", "verdict": verdict,
                    "numbers": [pair_text(o, p, ".2f") for o, p in pairs.items()], "why": reason, "pairs": pairs})
    return out
