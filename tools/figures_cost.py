"""The cost of ``--suite paper`` on H100s, from the recorded GPU step rates and the suite's plan:
GPU-hours per system and in all, and the wall time on 1, 8 and 64 GPUs with the phases run
as launch/slurm_suite.sh runs them (docs/operations.md quotes it).

How it is computed, every assumption a constant below or a sentence of the figure:
- Each planned run's phases (``config.schedule.phases``: train, warmup, distill, LiGO's
  operator, recovery) over its stages, each at its analytic training FLOPs
  (``analysis.flops.train_flops_per_token``, teachers' forwards included), plus its
  evaluations (forward FLOPs of ``eval.batches`` batches of every domain seen so far, at
  each stage's start and end and every ``eval.every`` steps).
- Each phase runs at the MFU the H200 record of configs/gpt_paper.yaml measured for the same
  stage shape, distilling or not (benchmarks/results/accelerator/gpt_paper.results.json); a
  shape the record lacks (SCHL-Reverse's reverse order) takes the record's row of the same
  kind nearest in FLOPs per token.
- An H100 runs at the H200's rate times the ratio of the same step recorded on both
  (paper M5, 32 x 1024, no teachers, layers scanned: ``variants-h100.results.json``'s plain
  step over ``results.json``'s).
- One run per GPU (the paper's M5 at batch 64 x 1024 needs 14.4 GiB); each phase of the plan
  (sweep, choice, main runs, report) starts when the one before ended, and its runs start in
  index order as GPUs free up, as a SLURM array does. Compilation, checkpoints, data
  preparation, the choice and the report are left out: minutes against hours.
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median
from typing import Any

from figures_text import Got, prose, thousands

from loire_jax.analysis.tables import markdown_table

ROOT = Path(__file__).resolve().parents[1]
ACCELERATOR = ROOT / "benchmarks" / "results" / "accelerator"
STAGES = "gpt_paper.results.json"  # every stage and phase of gpt_paper.yaml at 64 x 1024 on the H200
H200_STEP = "results.json"  # the H200's step part: paper M5 32 x 1024
H100_STEP = "variants-h100.results.json"  # the H100's variants part: the same step, "paper M5 plain"
GPUS = (1, 8, 64)


def _json(name: str) -> dict[str, Any]:
    return json.loads((ACCELERATOR / name).read_text())


def _part(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in data["parts"] if p["name"] == name)


def _m5_step(data: dict[str, Any], part: str, **want: Any) -> dict[str, Any]:
    """The record of paper M5 at 32 x 1024 without teachers (and ``want``) in one part."""
    rows = [r for r in _part(data, part)["records"] if r.get("shape") == "m5" and r.get("batch") == 32
            and r.get("seq") == 1024 and r.get("teachers") == 0 and r.get("tokens_per_s")
            and all(r.get(k) == v for k, v in want.items())]
    if len(rows) != 1:
        raise ValueError(f"{part}: {len(rows)} records of paper M5 32 x 1024 without teachers {want or ''}, not one")
    return rows[0]


def h100_factor() -> tuple[float, dict[str, Any], dict[str, Any], float]:
    """The H100's rate over the H200's for the same step, the two records, and what the
    unrolled layers GPUs use today gained over that step on the H100 (not counted)."""
    h200 = _m5_step(_json(H200_STEP), "step")
    h100 = _m5_step(_json(H100_STEP), "variants", variant="plain")
    unrolled = _m5_step(_json(H100_STEP), "variants", variant="unrolled")
    return h100["tokens_per_s"] / h200["tokens_per_s"], h200, h100, unrolled["tokens_per_s"] / h100["tokens_per_s"]


def _mfu_table() -> dict[tuple[tuple[int, ...], bool], float]:
    """(stage shape, distilling) -> MFU on the H200, from the gpt_paper.yaml record (the train
    and warmup rows of a shape averaged: the same program)."""
    rows = _part(_json(STAGES), "gpt_paper")["records"]
    out: dict[tuple[tuple[int, ...], bool], list[float]] = {}
    for r in rows:
        out.setdefault((tuple(r["shape"]), r["phase"] == "distill"), []).append(r["mfu"])
    return {k: sum(v) / len(v) for k, v in out.items()}


def _run_seconds(config, mfu: dict, peak: float) -> float:
    """One run's seconds on one GPU: every phase's FLOPs at its shape's MFU, and its evaluations."""
    from loire_jax.analysis.flops import forward_flops_per_token, train_flops_per_token
    from loire_jax.config.schedule import phases, seen_domains_at, stage_models, teacher_stages

    models = stage_models(config)
    tokens = config.batch_size * config.seq_len
    seconds = 0.0
    for k, stage in enumerate(config.stages):
        m = models[k]
        teachers = [models[j] for j in teacher_stages(config, k)]
        for p in phases(stage, bool(teachers)):
            flops = (p.end - p.start) * tokens * train_flops_per_token(m, config.seq_len, teachers if p.distill else ())
            seconds += flops / (_nearest(mfu, m, p.distill, config.seq_len) * peak)
        every = config.eval.every
        points = 2 + (stage.steps // every - (1 if stage.steps % every == 0 else 0) if every else 0)
        evals = points * len(seen_domains_at(config, k)) * config.eval.batches * tokens
        seconds += evals * forward_flops_per_token(m, config.seq_len) / (_nearest(mfu, m, False, config.seq_len) * peak)
    return seconds


def _nearest(mfu: dict, model, distill: bool, seq: int) -> float:
    """The MFU recorded for this shape, or for the recorded shape nearest in FLOPs per token."""
    from loire_jax.analysis.flops import forward_flops_per_token

    shape = (model.hidden, model.ffn, model.heads, model.layers)
    if (shape, distill) in mfu:
        return mfu[shape, distill]
    mine = forward_flops_per_token(model, seq)

    def gap(key) -> float:
        h, f, a, n = key[0]
        return abs(forward_flops_per_token(model.replace(hidden=h, ffn=f, heads=a, layers=n), seq) - mine)

    return mfu[min((k for k in mfu if k[1] == distill), key=gap)]


def _makespan(seconds: list[float], gpus: int) -> float:
    """Runs started in index order as GPUs free up (a job array): when the last ends."""
    free = [0.0] * min(gpus, max(len(seconds), 1))
    for s in seconds:
        i = min(range(len(free)), key=free.__getitem__)
        free[i] += s
    return max(free, default=0.0)


def paper_cost() -> dict[str, Any]:
    """Seconds on one H100 of every run of ``--suite paper`` (the sweep at its settings, the
    main runs at the base setting: the learning rate changes no FLOP), per system, in all,
    and the wall time of the plan's phases on 1, 8 and 64 GPUs."""
    from loire_jax.analysis.flops import PUBLISHED_PEAKS
    from loire_jax.experiments import plan as plans
    from loire_jax.experiments import suite as suites

    factor, h200, h100, unrolled = h100_factor()
    mfu = _mfu_table()
    peak = PUBLISHED_PEAKS["H200"] * factor
    suite = suites.load_suite("paper")
    runs = {p.workdir: p for p in suites.sweep_runs(suite) + suites.main_runs(suite, ())}
    plan = plans.items(suite)
    seconds = {i.index: _run_seconds(runs[i.workdir].config, mfu, peak) for i in plan if i.workdir in runs}
    systems: dict[str, list[float]] = {}
    for i in plan:
        if i.phase == "main":
            systems.setdefault(i.system, []).append(seconds[i.index])
    sweep = [seconds[i.index] for i in plan if i.phase == "sweep"]
    wall = {n: sum(_makespan([seconds[i.index] for i in plan if i.phase == phase and i.index in seconds], n)
                   for phase, _, _ in plans.phase_ranges(plan)) for n in GPUS}
    main = sum(i.phase == "main" for i in plan)
    return {"factor": factor, "h200": h200, "h100": h100, "unrolled": unrolled, "systems": systems, "sweep": sweep,
            "waves": {n: -(-main // n) for n in GPUS},
            "total": sum(seconds.values()), "wall": wall, "runs": len(seconds), "suite": suite,
            "phases": plans.phase_ranges(plan)}


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:,.0f}" if seconds >= 3600 * 10 else f"{seconds / 3600:,.1f}"


def _days(seconds: float) -> str:
    return f"{seconds / 86400:.1f} days" if seconds >= 86400 * 2 else f"{seconds / 3600:.1f} h"


def fig_paper_cost(got: Got) -> str:
    cost = paper_cost()
    suite = cost["suite"]
    h200, h100 = cost["h200"], cost["h100"]
    rows = [[system, str(len(runs)), _hours(sum(runs) / len(runs)), _hours(sum(runs))]
            for system, runs in cost["systems"].items()]
    rows.append([f"the sweep ({', '.join(suite.sweep.systems)} x {len(suite.sweep.settings())} settings)",
                 str(len(cost["sweep"])), _hours(sum(cost["sweep"]) / len(cost["sweep"])), _hours(sum(cost["sweep"]))])
    rows.append([f"**--suite paper**, {cost['runs']} runs", str(cost["runs"]), "-", f"**{_hours(cost['total'])}**"])
    table = markdown_table(("system", "runs", "GPU-hours a run", "GPU-hours"), rows)
    wall = markdown_table(("H100s", *map(str, GPUS)), [["wall time", *(_days(cost["wall"][n]) for n in GPUS)]])
    phases = ", ".join(f"{p} {a}-{b}" if a != b else f"{p} {a}" for p, a, b in cost["phases"])
    text = prose(
        f"On H100s, computed by tools/figures_cost.py from the recorded step rates and the plan "
        f"({phases}): every phase of every run at the MFU the H200 record of configs/gpt_paper.yaml measured "
        f"for its stage's shape (batch 64 × 1024, benchmarks/results/accelerator/gpt_paper.results.json; a shape "
        f"it lacks takes the nearest recorded one's), its evaluations as forward FLOPs at the same rate; an H100 at "
        f"{cost['factor']:.2f}× the H200 (the same step, paper M5 32 × 1024 without teachers: "
        f"{thousands(h100['tokens_per_s'])} tokens/s on the H100, {thousands(h200['tokens_per_s'])} on the H200, "
        f"layers scanned; GPUs now unroll them, which the H100 ran {cost['unrolled']:.2f}× faster, not counted here). "
        "Compiling, checkpoints, data preparation, the choice and the report are left out.")
    waves = cost["waves"][GPUS[-1]]
    after = prose(
        "Wall time with one run per GPU, the phases chained as launch/slurm_suite.sh submits them (each array's "
        f"runs started in index order as GPUs free up). On {GPUS[-1]} GPUs the main phase's "
        f"{sum(len(r) for r in cost['systems'].values())} runs take {waves} wave{'s' if waves > 1 else ''}: its "
        "longest runs set the time.")
    return text + "\n" + "\n".join(table) + "\n\n" + after + "\n" + "\n".join(wall)


def fig_suite_index(got: Got) -> str:
    """What running a suite's items one process each costs over one process running them:
    benchmarks/bench_suite_index.py's record. The suite's own part of an index (issue 54's
    bar: under 2 s) apart from what each process adds (Python, JAX, tracing again)."""
    bench = got("bench:cpu-suite-index")
    r = bench["rows"]
    return prose(
        f"Measured by `python benchmarks/bench_suite_index.py` ({bench['path']}, {r['cpus']} cores, load average "
        f"{r['load_average'][0]} at the end): the suite's own part of an index (load the suite and number its plan, "
        f"resolve the index, check the workdir's plan and that the item may start, take the workdir, read whether "
        f"its run is over, take and release the run's lock) took {r['median_suite_part_s']:.3f} s (median of "
        f"{len(r['suite_part_s'])}, at most {r['max_suite_part_s']:.3f} s). A process for an item already done "
        f"(Python, imports, JAX's start and that part) took {r['median_done_item_s']:.1f} s "
        f"({r['median_done_item_cpu_s']:.1f} s of CPU). Running {r['items']} items of a micro suite one process "
        f"each took {median(r['one_per_item_s']):.1f} s against {median(r['one_process_s']):.1f} s in one process "
        f"(programs in a warm compilation cache): {r['median_overhead_s']:.1f} s more per index "
        f"({r['median_overhead_cpu_s']:.1f} s of CPU; median of {r['repeats']}), as each process also traces its "
        "programs again and loads them from the cache, which one process does once for runs of the same shapes. "
        "On a cluster that is seconds against a task's minutes or hours; on this shared machine the wall times grow "
        "with the load.")
