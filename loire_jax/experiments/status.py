"""``--status``: where every planned item of a suite's workdir stands, read and never written.

Each item is one of:
- **done**: a run's ``made.json`` records its config (or, for a run finished before that
  file existed, its metrics say every stage was evaluated); a fine-tuning's ``results.json``
  is there; the choice's ``suite.json``; a report newer than every run. A run that failed
  the sanity gate or diverged is done but **failed (gate)**: it counts for nothing.
- **running**: a live lock holds its directory (``store.locks.held_locks``, which reads the
  lock files and takes none): the holder's host and pid, since when, and the stage and step
  of its last logged training step.
- **failed**: it ended with bad input or a bug (``records.read_failure``): its one line and
  exit code. Nothing retries it.
- **stopped**: it trained part of the way and nothing runs it now (a preempted job that was
  not requeued): rerunning the same item resumes it.
- **waiting**: what it needs is not done (a main run before the choice, a fine-tuning
  before its run, the report before every run).
- **not started**.

The time left is estimated from the finished runs' measured seconds per planned FLOP
(``made.json``), applied to each unfinished run's planned FLOPs (the part still to train of
a stopped or running one), and the finished fine-tunings' mean time for the rest.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from typing import Any, Mapping, Sequence

from loire_jax import outputs, paths
from loire_jax.experiments import records
from loire_jax.experiments import suite as suites
from loire_jax.experiments.plan import Item, PlanError, span
from loire_jax.experiments.runner import chosen
from loire_jax.store.locks import LOCK, held_locks


@dataclasses.dataclass(frozen=True)
class State:
    """One item's state (the module's docstring), what to say about it, and for a run the
    share of its planned steps still to train."""

    item: Item
    state: str
    detail: str = ""
    left: float | None = None  # the share of the item still to do (1.0 not started, 0.0 done)
    seconds: float | None = None  # a finished item's measured time (a run's training, a fine-tuning's)
    flops: float | None = None  # a finished run's planned FLOPs


def check_root(root: paths.Path) -> None:
    """``--status`` reads a suite's workdir only: refuse anything else in one line."""
    if not root.is_dir():
        raise PlanError(f"{root} does not exist, so no suite has run there; pass the --workdir the suite runs in")
    if not (root / outputs.EXPERIMENT).exists():
        raise PlanError(f"{root} is no suite's workdir (no {outputs.EXPERIMENT}, which launch/experiment.py writes "
                        "in every workdir it runs a suite in); pass the --workdir the suite runs in")


def _tail_progress(run_dir: paths.Path) -> tuple[int, int] | None:
    """(stage, step) of the last training record in ``metrics.jsonl``, from its last 64 KB."""
    path = run_dir / "metrics.jsonl"
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 65536))
            lines = fh.read().decode(errors="replace").splitlines()
    except (OSError, ValueError):
        return None
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut by the seek, or being written
        if isinstance(rec, dict) and rec.get("kind") == "train" and isinstance(rec.get("step"), int):
            return int(rec.get("stage", 0)), rec["step"]
    return None


def _holder(directory: paths.Path) -> str | None:
    """The live holder of ``directory``'s own lock, in words, or None: read, never taken."""
    for h in held_locks(directory):
        if h.path == directory / LOCK:
            try:
                started = float(json.loads(h.path.read_text()).get("started"))
                import datetime

                since = datetime.datetime.fromtimestamp(started).strftime("%Y-%m-%d %H:%M:%S")
            except (OSError, ValueError, TypeError):
                since = "?"
            return f"pid {h.pid} on {h.host}, since {since}"
    return None


def _planned_steps(config) -> list[int]:
    return [stage.steps for stage in config.stages]


def _share_left(config, at: tuple[int, int] | None) -> float:
    """The share of a run's planned steps still to train, from its last logged step."""
    steps = _planned_steps(config)
    if at is None:
        return 1.0
    stage, step = at
    done = sum(steps[: max(stage - 1, 0)]) + step
    return max(0.0, 1.0 - done / max(sum(steps), 1))


def _run_state(root: paths.Path, item: Item, planned, failure: Mapping[str, Any] | None) -> State:
    run_dir = root / item.workdir
    at = _tail_progress(run_dir)
    holder = _holder(run_dir) if run_dir.is_dir() else None
    if holder is not None:
        where = f"stage {at[0]} step {at[1]}" if at else "starting"
        return State(item, "running", f"{holder}; at {where}", _share_left(planned.config, at))
    made = records.read_made(run_dir, planned.config)
    if made is None and (run_dir / "config.json").exists():
        made = _finished_without_record(run_dir, planned)
    if made is not None:
        gate = made.get("gate") or {}
        cost = {k: float(made[k]) if isinstance(made.get(k), (int, float)) else None for k in ("wall_s", "flops")}
        if made.get("diverged"):
            return State(item, "failed (gate)", f"diverged: {made['diverged']}", 0.0)
        where = ", ".join(str(made[k]) for k in ("host", "device_kind", "finished") if made.get(k))
        if gate and not gate.get("passed"):
            return State(item, "failed (gate)", f"finished, but not below the unigram entropy by the margin ({where})",
                         0.0, cost["wall_s"], cost["flops"])
        return State(item, "done", where, 0.0, cost["wall_s"], cost["flops"])
    if failure is not None:
        return State(item, "failed", f"exit {failure.get('code')}: {failure.get('error')}", 1.0)
    if at is not None:
        return State(item, "stopped", f"at stage {at[0]} step {at[1]}, not running: rerun item {item.index} to "
                                      "resume it", _share_left(planned.config, at))
    return State(item, "not started", "", 1.0)


def _finished_without_record(run_dir: paths.Path, planned) -> dict[str, Any] | None:
    """A run of this config whose every stage was evaluated, finished before ``made.json``
    existed: read whole (slower, rare)."""
    from loire_jax.analysis.reports import ReportError, load_run, summarize

    try:
        run, recs = load_run(run_dir)
    except (ReportError, ValueError, OSError):
        return None
    if records.config_differences(run, planned.config):
        return None
    if summarize(run, recs)["totals"]["stages_finished"] != len(run.stages):
        return None
    return {"host": "where not recorded"}


def states(suite: suites.Suite, root: paths.Path, plan: Sequence[Item]) -> list[State]:
    """Every item's state, read from the workdir (nothing written, no lock taken)."""
    from loire_jax.config.loader import load_finetune_config

    got = chosen(root, suite)
    setting = got[0] if got is not None else ()
    sweep = {p.workdir: p for p in suites.sweep_runs(suite)}
    main = {p.workdir: p for p in suites.main_runs(suite, setting)}
    by_index: dict[int, State] = {}
    jobs: dict[str, str] = {}
    for item in plan:
        failure = records.read_failure(root, item.key())
        if item.phase == "sweep":
            st = _run_state(root, item, sweep[item.workdir], failure)
        elif item.phase == "choice":
            if got is not None:
                st = State(item, "done", f"{' '.join(got[0])} ({got[1]})", 0.0)
            elif failure is not None:
                st = State(item, "failed", f"exit {failure.get('code')}: {failure.get('error')}", 1.0)
            else:
                st = _waiting_or_not(item, by_index)
        elif item.phase == "main":
            if suite.sweep is not None and got is None:
                st = State(item, "waiting", f"for the choice (item {item.needs[0]})", 1.0)
            else:
                st = _run_state(root, item, main[item.workdir], failure)
        elif item.phase == "finetune":
            if item.task not in jobs:
                jobs[item.task] = load_finetune_config(item.task, suite.downstream.overrides).job_name
            st = _finetune_state(root, item, main[item.workdir], jobs[item.task], failure, by_index)
        else:
            st = _report_state(root, item, failure, by_index)
        by_index[item.index] = st
    return [by_index[i.index] for i in plan]


def _waiting_or_not(item: Item, by_index: Mapping[int, State]) -> State:
    open_ = [i for i in item.needs if by_index[i].state not in ("done", "failed (gate)")]
    return State(item, "waiting", f"for item(s) {span(open_)}", 1.0) if open_ else State(item, "not started", "", 1.0)


def _finetune_state(root, item: Item, planned, job: str, failure, by_index) -> State:
    folder = root / item.workdir / "finetune" / job / f"stage{len(planned.config.stages)}"
    result = records.read_json(folder / f"seed{planned.seed}" / "results.json")
    if result is not None:
        wall = result.get("wall_s_last_call")
        return State(item, "done", "", 0.0, float(wall) if isinstance(wall, (int, float)) else None)
    holder = _holder(folder) if folder.is_dir() else None
    if holder is not None:
        return State(item, "running", holder, 0.5)
    if failure is not None:
        return State(item, "failed", f"exit {failure.get('code')}: {failure.get('error')}", 1.0)
    run = by_index[item.needs[0]]
    if run.state == "failed (gate)" and run.detail.startswith("diverged"):
        return State(item, "done", "skipped: the run diverged", 0.0)
    if run.state != "done" and run.state != "failed (gate)":
        return State(item, "waiting", f"for item {item.needs[0]} (its run)", 1.0)
    return State(item, "not started", "", 1.0)


def _report_state(root, item: Item, failure, by_index) -> State:
    over = ("done", "failed (gate)", "failed")
    open_ = [i for i in item.needs if by_index[i].state not in over]
    if open_:
        return State(item, "waiting", f"for item(s) {span(open_)}", 1.0)
    report = root / "report" / "report.json"
    if report.exists():
        newest = max((_mtime(root / by_index[i].item.workdir / records.MADE) for i in item.needs
                      if by_index[i].item.phase == "main"), default=0.0)
        if _mtime(report) >= newest:
            return State(item, "done", str(root / "report" / "report.md"), 0.0)
        return State(item, "not started", "the report there is older than a run: rerun this item", 1.0)
    if failure is not None:
        return State(item, "failed", f"exit {failure.get('code')}: {failure.get('error')}", 1.0)
    return State(item, "not started", "", 1.0)


def _mtime(path: paths.Path) -> float:
    """When a file was last written (0 if it is not there), on a local disk or a bucket."""
    try:
        return os.path.getmtime(os.fspath(path)) if paths.is_local(path) else float(path.stat().mtime)
    except (OSError, ValueError, AttributeError):
        return 0.0


# ----------------------------------------------------------------------- the time left
def time_left(suite: suites.Suite, root: paths.Path, found: Sequence[State]) -> str:
    """The estimate's line: the finished runs' measured seconds per planned FLOP (``made.json``)
    times each unfinished run's FLOPs still to train, plus the fine-tunings' mean time."""
    from loire_jax.analysis.flops import stage_flops
    from loire_jax.config.schedule import stage_models

    got = chosen(root, suite)
    configs = {p.workdir: p.config for p in suites.sweep_runs(suite)}
    configs.update({p.workdir: p.config for p in suites.main_runs(suite, got[0] if got else ())})
    timed = [st for st in found if st.item.phase in ("sweep", "main") and st.seconds is not None and st.flops]
    wall, flops = sum(st.seconds for st in timed), sum(st.flops for st in timed)
    tune_s = [st.seconds for st in found if st.item.phase == "finetune" and st.seconds is not None]
    over = ("done", "failed (gate)", "failed")
    todo = [st for st in found if st.item.phase in ("sweep", "main") and st.state not in over]
    tunes = [st for st in found if st.item.phase == "finetune" and st.state not in over]
    if not todo and not tunes:
        return "time left: none; every run and fine-tuning is over" + (
            "" if found[-1].state == "done" else f" (the report is item {found[-1].item.index})")
    if not timed:
        return (f"time left: not estimated yet: no finished run has recorded its time ({len(todo)} runs and "
                f"{len(tunes)} fine-tunings to go)")
    rate = wall / flops
    seconds = sum(rate * sum(stage_flops(configs[st.item.workdir], stage_models(configs[st.item.workdir])))
                  * (st.left if st.left is not None else 1.0) for st in todo)
    tune_note = ""
    if tunes:
        if tune_s:
            seconds += statistics.fmean(tune_s) * sum(st.left if st.left is not None else 1.0 for st in tunes)
            tune_note = f" and {len(tunes)} fine-tunings (their mean so far: {statistics.fmean(tune_s):.0f} s)"
        else:
            tune_note = f"; {len(tunes)} fine-tunings not counted (none has finished to time them)"
    running = sum(st.state == "running" for st in found)
    parallel = f"; {running} running at once: about {_duration(seconds / running)} of wall time" if running > 1 else ""
    return (f"time left: about {_duration(seconds)} of device time for {len(todo)} runs{tune_note}: each run's "
            f"planned FLOPs at the {len(timed)} finished runs' measured {rate * 1e12:.3g} s per TFLOP "
            f"({_duration(wall)} for {flops:.3g} FLOPs){parallel}")


def _duration(seconds: float) -> str:
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 90:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


# ----------------------------------------------------------------------- the lines
def status_lines(suite: suites.Suite, root: paths.Path, plan: Sequence[Item]) -> list[str]:
    """``--status``'s output: a summary line, one line per item, the time left."""
    found = states(suite, root, plan)
    counts: dict[str, int] = {}
    for st in found:
        counts[st.state] = counts.get(st.state, 0) + 1
    summary = ", ".join(f"{n} {state}" for state, n in counts.items())
    lines = [f"suite {suite.name} in {root}: {len(plan)} items: {summary}"]
    for st in found:
        where = st.item.workdir or ("suite.json" if st.item.phase == "choice" else "report/")
        what = f"{where} {st.item.task}" if st.item.task else where
        lines.append(f"{st.item.index:>5} {st.item.phase:<8} {what:<36} {st.state}" + (f": {st.detail}" if st.detail
                                                                                           else ""))
    lines.append(time_left(suite, root, found))
    return lines

