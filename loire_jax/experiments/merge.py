"""``--merge DIR ...``: bring runs made in other workdirs (a cluster without a shared
filesystem, a short GPU slot that returns only files) into a suite's workdir.

Every source is checked whole before anything is copied, and one refusal refuses the
merge: nothing is copied from any source, nothing in the workdir changes. A source is the
workdir of the same suite (its ``.loire_experiment``), run with any seed list or index
range; each run in it must be
- a run this suite plans (its folder is a planned item's), not in use (no live lock);
- the run the suite plans there: its saved config against the plan's for that system, seed
  and setting, every setting that shaped its steps compared as a resume compares them
  (``store.resume.history_changes``, every stage), its name (the suite's) and evaluation
  too; where and how it ran (mesh, data folder, checkpoint cadence, execution choices) may
  differ. The first difference is named (another setting, another suite, another code
  version whose steps would differ);
- finished (every stage evaluated, or recorded as diverged), its metrics whole;
- intact: each stage's newest checkpoint is that stage of the run (``store.provenance``:
  its meta's digest, model and history) and the last stage's arrays match the checksums
  written at save (``store.checkpoints.restore_params``).

A run made on another device kind than the others is accepted and said so; the report
marks it. A run already in the workdir is left alone when its steps are the same (the
digest of every logged step), refused otherwise. The sweep's choice (``suite.json``) and
the gate's bar (``entropy.json``) come along where the workdir lacks them.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import shutil
from typing import Any, Sequence

from loire_jax import outputs, paths
from loire_jax.experiments import records
from loire_jax.experiments import suite as suites
from loire_jax.experiments.plan import PlanError
from loire_jax.experiments.runner import DIVERGED, SUITE_FILE, chosen


@dataclasses.dataclass(frozen=True)
class Copy:
    source: paths.Path  # the run's folder in its source
    workdir: str  # the planned run's folder, relative to the suite's
    device: str | None  # the device kind its made.json names
    digest: str  # the planned config's (records.config_digest), for a made.json the source lacks
    name: str


@dataclasses.dataclass
class Merge:
    """What a checked merge does: the runs to copy, those already here, the files to adopt."""

    copies: list[Copy] = dataclasses.field(default_factory=list)
    present: list[str] = dataclasses.field(default_factory=list)
    adopt: dict[str, paths.Path] = dataclasses.field(default_factory=dict)  # suite.json, entropy.json -> source
    notes: list[str] = dataclasses.field(default_factory=list)


def _steps_digest(recs: Sequence[dict[str, Any]]) -> str:
    """A SHA-256 of every logged step (stage, step, loss, gradient norm), a resumed run's
    repeated steps once (the last), as figures_records.suite_runs digests a suite."""
    last = {(r["stage"], r["step"]): (r["stage"], r["step"], r["loss"], r.get("grad_norm"))
            for r in recs if r.get("kind") == "train"}
    return hashlib.sha256(json.dumps([last[k] for k in sorted(last)]).encode()).hexdigest()


def _run_dirs(source: paths.Path) -> list[str]:
    """The run folders of a suite's workdir (``runs/<system>/seed<k>``, ``sweep/<setting>/<system>``)."""
    out = []
    for part in ("sweep", "runs"):
        base = source / part
        if base.is_dir():
            out += sorted(f"{part}/{a.name}/{b.name}" for a in base.iterdir() if a.is_dir() and not a.name.startswith(".")
                          for b in a.iterdir() if b.is_dir() and not b.name.startswith("."))
    return out


def _kind_of(item_key: str, setting_keys: set[str]) -> str:
    """Why a difference matters, in words, from the field that differs."""
    if item_key == "name":
        return "a run of another suite"
    if item_key in setting_keys:
        return "a run of another setting"
    return "another config, or a code version whose steps would differ"


def check(suite: suites.Suite, root: paths.Path, sources: Sequence[str]) -> Merge:
    """Every source checked against the suite's plan for ``root`` (the module's docstring);
    a refusal is one PlanError naming the source, the run and what differs."""
    merge = Merge()
    srcs = _sources(root, sources)
    setting = _setting(suite, root, srcs, merge)
    planned = {p.workdir: p for p in suites.sweep_runs(suite)}
    if setting is not None:
        planned.update({p.workdir: p for p in suites.main_runs(suite, setting)})
    devices: collections.Counter[str] = collections.Counter()
    for workdir in _run_dirs(root):
        made = records.read_json(root / workdir / records.MADE) or {}
        if made.get("device_kind"):
            devices[made["device_kind"]] += 1
    for src in srcs:
        for workdir in _run_dirs(src):
            if workdir not in planned:
                why = ("the suite's setting is not chosen yet: merge a workdir that holds its suite.json (the "
                       "choice), or run the choice item here first") if workdir.startswith("runs/") and setting is None \
                    else "no run of this suite's plan is there (another suite, or other seeds or systems)"
                raise PlanError(f"--merge: {src / workdir}: {why}; nothing was merged")
            copy = _check_run(suite, root, src, workdir, planned[workdir].config)
            if copy is None:
                merge.present.append(workdir)
                continue
            if any(c.workdir == workdir for c in merge.copies):
                raise PlanError(f"--merge: two sources hold {workdir}; merge one of them; nothing was merged")
            merge.copies.append(copy)
            if copy.device:
                devices[copy.device] += 1
        entropy = src / records.ENTROPY
        if entropy.exists() and not (root / records.ENTROPY).exists() and records.ENTROPY not in merge.adopt:
            if records.read_entropy(src, suites.base_config(suite).to_dict()["data"]) is not None:
                merge.adopt[records.ENTROPY] = entropy
    if len(devices) > 1:
        common = devices.most_common(1)[0][0]
        merge.notes += [f"{c.workdir} was made on {c.device}, not {common} as most runs here: accepted, and marked in "
                        "the report" for c in merge.copies if c.device and c.device != common]
    return merge


def _sources(root: paths.Path, sources: Sequence[str]) -> list[paths.Path]:
    """The sources, each a local workdir of a suite other than ``root``."""
    from loire_jax.store.workdir import resolve

    if not paths.is_local(root):
        raise PlanError(f"--merge copies into a local or mounted workdir, not {root}; copy the runs down first")
    srcs = []
    for text in sources:
        src = resolve(text)
        if not paths.is_local(src):
            raise PlanError(f"--merge {text}: copy a {paths.scheme(src)}:// workdir down first (gsutil -m cp -r); "
                            "--merge reads local or mounted directories; nothing was merged")
        if not src.is_dir():
            raise PlanError(f"--merge {text}: no such directory; nothing was merged")
        if os.path.realpath(os.fspath(src)) == os.path.realpath(os.fspath(root)):
            raise PlanError(f"--merge {text} is this suite's own workdir; name the workdirs to bring runs from")
        if not (src / outputs.EXPERIMENT).exists():
            raise PlanError(f"--merge {text} is no suite's workdir (no {outputs.EXPERIMENT}); name the --workdir a "
                            "suite ran in (its runs/ and sweep/ are merged); nothing was merged")
        srcs.append(src)
    return srcs


def _setting(suite: suites.Suite, root: paths.Path, srcs: Sequence[paths.Path], merge: Merge
             ) -> tuple[str, ...] | None:
    """The setting the main runs are checked against: this workdir's choice, else the
    sources' (adopted with them); None while no choice exists anywhere."""
    settings = {str(root): chosen(root, suite)} if (root / SUITE_FILE).exists() else {}
    for src in srcs:
        if (src / SUITE_FILE).exists():
            got = chosen(src, suite)
            if got is None:
                raise PlanError(f"--merge {src}: its {SUITE_FILE} is not this suite's sweep (another grid: another "
                                "suite); nothing was merged")
            settings[str(src)] = got
    distinct = {tuple(got[0]) for got in settings.values() if got is not None}
    if len(distinct) > 1:
        shown = "; ".join(f"{' '.join(got[0])} in {where}" for where, got in settings.items() if got)
        raise PlanError(f"--merge: the sweep chose different settings ({shown}): runs of another setting; nothing "
                        "was merged")
    if distinct and suite.sweep is not None and not (root / SUITE_FILE).exists():
        merge.adopt[SUITE_FILE] = next(paths.as_path(w) / SUITE_FILE for w, got in settings.items() if got)
    return next(iter(distinct)) if distinct else (() if suite.sweep is None else None)


def _check_run(suite: suites.Suite, root: paths.Path, src: paths.Path, workdir: str, want) -> Copy | None:
    """One source run against the plan's config ``want`` (the module's docstring); None when
    the workdir holds the same run already."""
    from loire_jax.analysis.records import read_records
    from loire_jax.analysis.reports import ReportError, load_run, record_problem, summarize
    from loire_jax.store.checkpoint_errors import CheckpointError
    from loire_jax.store.locks import held_locks

    where = src / workdir
    if held := held_locks(where):
        raise PlanError(f"--merge: {where} is in use (a live lock: {held[0].describe()}); merge it once it is done; "
                        "nothing was merged")
    if (where / "metrics.jsonl").exists():  # before load_run, which would skip them with a warning
        recs, bad = read_records(where)
        wrong = [p for p in map(record_problem, recs) if p]  # a record the report cannot read is damage too
        if wrong:
            raise PlanError(f"--merge: {where} is damaged: {len(wrong)} record(s) of its metrics.jsonl the report "
                            f"cannot read ({wrong[0]}); nothing was merged")
        if not (where / "metrics.jsonl").read_bytes().endswith(b"\n"):
            raise PlanError(f"--merge: {where} is half-written: its metrics.jsonl ends in the middle of a line (a copy "
                            "cut short, or a run still writing); nothing was merged")
        if bad:
            raise PlanError(f"--merge: {where} is damaged or half-written: metrics.jsonl has {len(bad)} malformed "
                            f"line(s) (line {bad[0]}{' ...' if len(bad) > 1 else ''}); nothing was merged")
    try:
        run, recs = load_run(where)
    except (ReportError, ValueError, OSError) as err:
        raise PlanError(f"--merge: {where} is half-written or damaged ({str(err).splitlines()[0]}); nothing was "
                        "merged") from None
    changes = records.config_differences(run, want)
    if changes:
        setting_keys = {k for k, _ in suite.sweep.grid} if suite.sweep else set()
        key = next((k for k in setting_keys if changes[0].startswith(k + ":")), changes[0].split(":", 1)[0])
        raise PlanError(f"--merge: {where} is not the run this suite plans at {workdir} ({_kind_of(key, setting_keys)}"
                        f"): {changes[0].replace(' -> ', ' in it, ', 1)} planned"
                        f"{f' (and {len(changes) - 1} more)' if len(changes) > 1 else ''}; nothing was merged")
    diverged = _diverged(where, run)
    if not diverged and summarize(run, recs)["totals"]["stages_finished"] != len(run.stages):
        raise PlanError(f"--merge: {where} is unfinished (not every stage evaluated); finish it there (rerun its "
                        "command, which resumes it) and merge it then; nothing was merged")
    try:
        _check_checkpoints(run, where, diverged)
    except (CheckpointError, ValueError, OSError) as err:
        raise PlanError(f"--merge: {where} is damaged: {str(err).splitlines()[0]}; nothing was merged") from None
    here = root / workdir
    if here.exists():
        try:
            _, mine = load_run(here)
        except (ReportError, ValueError, OSError):
            mine = None
        if mine is not None and _steps_digest(mine) == _steps_digest(recs):
            return None
        what = "a run whose steps differ from" if mine is not None else "something else than"
        raise PlanError(f"--merge: {here} already holds {what} the run in {where}; move one of them away first; "
                        "nothing was merged")
    made = records.read_json(where / records.MADE) or {}
    return Copy(where, workdir, made.get("device_kind"), records.config_digest(want), want.name)


def _diverged(where: paths.Path, run) -> bool:
    """Whether the run recorded that it diverged (a result: over, failing the gate)."""
    saved = records.read_json(where / DIVERGED)
    return bool(saved and saved.get("error") and saved.get("config") == run.to_dict())


def _check_checkpoints(run, where: paths.Path, diverged: bool) -> None:
    """Each stage's newest checkpoint is that stage of ``run`` (meta digest, model, history);
    the last one's arrays match their recorded checksums. A diverged run keeps what it saved."""
    import jax

    from loire_jax.config.model import ModelConfig
    from loire_jax.model.params import abstract_params
    from loire_jax.store.checkpoint_steps import latest_complete_step, stage_dir
    from loire_jax.store.checkpoints import restore_params
    from loire_jax.store.provenance import check_stage

    last = None
    for k in range(1, len(run.stages) + 1):
        if latest_complete_step(stage_dir(where, k)) is None:
            if diverged:
                break
            raise ValueError(f"stage_{k} holds no complete checkpoint")
        last = (k, check_stage(run, k, where))
    if last is None:
        return
    k, meta = last
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one),
                            abstract_params(ModelConfig.from_dict(meta["model"])))
    restore_params(stage_dir(where, k), abstract)


def _locks(folder: str, names: list[str]) -> list[str]:
    from loire_jax.store.locks import is_lock

    return [n for n in names if is_lock(n)]


def apply(merge: Merge, root: paths.Path) -> list[str]:
    """Copy what ``check`` accepted: each run into a hidden folder beside its place, then
    renamed into it (a run appears whole or not at all), lock files left behind; the source's
    ``made.json`` gains where it was merged from. Returns the lines to print."""
    lines = []
    for c in merge.copies:
        target = root / c.workdir
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".{target.name}.merging-{os.getpid()}"
        try:
            shutil.copytree(os.fspath(c.source), os.fspath(tmp), ignore=_locks, symlinks=True)
            made = records.read_json(tmp / records.MADE) or {"host": "not recorded", "config": c.digest,
                                                              "name": c.name}
            made.update({"merged_from": os.fspath(c.source), "merged_at": records.now()})
            paths.write_atomic(tmp / records.MADE, json.dumps(made, indent=1) + "\n")
            os.rename(os.fspath(tmp), os.fspath(target))
        finally:
            if tmp.exists():
                shutil.rmtree(os.fspath(tmp))
        lines.append(f"merged {c.workdir} from {c.source}" + (f" (made on {c.device})" if c.device else ""))
    for name, source in merge.adopt.items():
        paths.write_atomic(root / name, source.read_text())
        lines.append(f"took {name} from {source.parent}")
    lines += [f"already here: {w} (the same steps)" for w in merge.present]
    return lines + merge.notes
