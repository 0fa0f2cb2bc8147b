"""What a comparison suite measured: each run's result (AP and AP+ per stage, Init after
growth, cost, the old-data tokens it replayed, the sanity gate, where its wall time went)
and, per system, the same over its seeds.

The sanity gate: a run whose train loss at the end of any stage is not at least ``margin``
nats below the unigram entropy of that stage's data learned nothing a unigram table would
not, so it is never counted as a win or a loss (``gate``).

The same machinery serves decoders (LOIRE-GPT) and encoders (LOIRE-Bert): the fixed-size
baselines are GPT_L and GPT_R beside a decoder and BERT_L and BERT_R beside an encoder
(``family``), and an encoder's perplexities are masked-LM perplexities (the masked
positions of fixed validation masks), so its Init equals the previous Final just the same.
Everything here is a pure function of run configs and metrics records.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

from loire_jax.analysis.reports import last_by, summarize
from loire_jax.analysis.tables import seed_stats
from loire_jax.config.run import RunConfig
from loire_jax.config.schedule import replay_tokens as planned_replay
from loire_jax.config.stage import stage_number

# The family of each model kind: the prefix of its fixed-size baselines.
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


def scratch_baselines(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> tuple[str, str]:
    """The suite's L and R baselines: GPT_L and GPT_R, or BERT_L and BERT_R."""
    fam = family(results)
    return f"{fam}_L", f"{fam}_R"


def complete(r: Mapping[str, Any]) -> bool:
    """Finished every stage (a diverged run is over, but not complete)."""
    return r["finished"] and not r.get("diverged")


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


def replay_tokens(run: RunConfig, records: Sequence[Mapping[str, Any]]) -> list[int]:
    """The old-data tokens (windows of earlier domains' recovery memory) each stage trained
    on: its "replay" record, or for a run recorded before the record existed, the plan's
    count (``schedule.replay_tokens``, the same pure function of the config)."""
    logged = {r["stage"]: r["tokens"] for r in records if r.get("kind") == "replay"}
    return [logged.get(stage_number(k), planned_replay(run, k)) for k in range(len(run.stages))]


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
        "replay_tokens": replay_tokens(run, records),
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
            "flops": [seed_stats([r["flops"][k] for r in runs if complete(r)]) for k in range(stages)],
            "wall_s": [seed_stats([r["wall_s"][k] for r in runs if complete(r)]) for k in range(stages)],
            # the old data it trained on, in total: the same at every seed (a function of the config)
            "replay_tokens": seed_stats([sum(r["replay_tokens"]) for r in runs if r.get("replay_tokens")]),
        }
    return out


def cost_ratios(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """LOIRE's FLOPs and wall time over GPT_L's and GPT_R's (BERT_L's and BERT_R's), per
    stage and in total (means over the finished runs of both, seed by seed where both have
    the seed)."""
    out = []
    mine = {r["name"].rsplit("-s", 1)[-1]: r for r in results.get("LOIRE", ()) if complete(r)}
    for other in scratch_baselines(results):
        theirs = {r["name"].rsplit("-s", 1)[-1]: r for r in results.get(other, ()) if complete(r)}
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
