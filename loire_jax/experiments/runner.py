"""Carrying a suite's plan out: the whole suite in one process (``Experiment.run``), or the
items a job array's task names (``Experiment.run_items``), the same code either way.

Each item does exactly what the one-process suite does at that point, so a suite run as
arrays and merged leaves the same runs, step for step, as one command: a sweep or main run
is ``train.run`` in its own workdir (resumed if it was stopped, skipped if it is over); the
choice reads the sweep's results and writes ``suite.json``; a fine-tuning is
``downstream.finetune`` on its run's final stage; the report reads every run.

An item that cannot run yet (a main run before the choice, a fine-tuning before its run,
the report before every run) is refused at once in one line naming what it waits for, and
nothing is recorded: it is the order that was wrong, not the item. An item that fails (bad
input, 2; a bug, 1) is recorded (``records.record_failure``) for ``--status`` and the
report, and is never retried by itself.
"""

from __future__ import annotations

import json
import time
import traceback
from functools import partial
from typing import Any, Callable, Sequence

from loire_jax import paths
from loire_jax.errors import ENVIRONMENT, FAILED, USER, USER_ERRORS, RunError, fail, first_line, os_reason
from loire_jax.experiments import plan as plans
from loire_jax.experiments import records, suite_figures
from loire_jax.experiments import suite as suites
from loire_jax.experiments.plan import Item, PlanError

DIVERGED = "diverged.json"  # in a run's workdir: the run diverged with this config (kept, not retried)
SUITE_FILE = "suite.json"  # the sweep's choice


class Waiting(PlanError):
    """An item started before what it needs is done: the order was wrong, not the item."""


def chosen(root: paths.Path, suite: suites.Suite) -> tuple[tuple[str, ...], str] | None:
    """The setting a choice made in this workdir, if it is this suite's (``suite.json``)."""
    try:
        saved = json.loads((root / SUITE_FILE).read_text())
        if suite.sweep is not None and [list(s) for s in suite.sweep.settings()] != saved.get("grid"):
            return None
        return tuple(saved["setting"]), str(saved["why"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # absent or not ours: the sweep decides
        return None


class Pieces:
    """The work of one item in a suite's workdir: a run, a fine-tuning, the report, and what
    each leaves (``made.json``, failure records). ``mesh``: the devices' mesh (None where no
    item trains); ``failed(err, code)`` reports a run's failure (a multi-process job's
    processes leave together: the CLI passes ``devices.failed``); ``lead``: this process
    writes the suite's own files (process 0 of a multi-process job)."""

    def __init__(self, suite: suites.Suite, root: paths.Path, mesh=None, *, progress: bool = False,
                 failed: Callable[[Any, int], int] = fail, lead: bool = True,
                 device: Callable[[], dict[str, Any]] | None = None) -> None:
        self.suite, self.root, self.mesh, self.progress = suite, root, mesh, progress
        self.failed, self.lead, self.device = failed, lead, device
        self.say: Callable[..., None] = print if lead else (lambda *a, **k: None)  # process 0 speaks for all
        self.plan = plans.items(suite)
        self._entropy_cache: dict[str, float] | None = None
        self._results: dict[str, dict[str, Any]] = {}  # workdir -> result of a run that is over
        self.last_error: str | None = None

    # ------------------------------------------------------------------ shared pieces
    def _fail(self, err: Any, code: int) -> int:
        self.last_error = first_line(err)
        return self.failed(err, code)

    @property
    def entropy(self) -> dict[str, float]:
        """Unigram entropy (nats) of each domain's training split, the sanity gate's bar:
        from ``entropy.json`` where an earlier item (or a merged workdir) recorded it, else
        computed from the prepared corpus and recorded."""
        if self._entropy_cache is None:
            base = suites.base_config(self.suite)
            data = base.to_dict()["data"]
            found = records.read_entropy(self.root, data)
            if found is None:
                found = suite_figures.entropy(base, self.progress)
                if self.lead:
                    records.write_entropy(self.root, data, found)
            self._entropy_cache = found
        return self._entropy_cache

    def outcome(self, planned) -> dict[str, Any] | None:
        """The run's result if it is over (every stage evaluated, or recorded as diverged),
        else None; read once and kept. A workdir holding another config is refused: its
        numbers would pass for this one's."""
        from loire_jax.analysis.reports import ReportError, load_run
        from loire_jax.analysis.suite_results import run_result

        if planned.workdir in self._results:
            return self._results[planned.workdir]
        workdir = self.root / planned.workdir
        try:
            run, records_ = load_run(workdir)
        except (ReportError, ValueError, OSError):
            return None
        changes = records.config_differences(run, planned.config)
        if changes:
            raise RunError(f"{workdir} holds a run of another config than this suite plans ({changes[0]}: the suite, "
                           "its seeds or its sweep changed); give the suite another --workdir, or move that run away")
        try:
            saved = json.loads((workdir / DIVERGED).read_text())
            diverged = saved.get("error") if saved.get("config") == planned.config.to_dict() else None
        except (OSError, ValueError):
            diverged = None
        result = run_result(run, records_, self.entropy, self.suite.gate_margin, diverged=diverged)
        if not result["finished"]:
            return None
        made = records.read_made(workdir, planned.config)
        if made is not None:
            result["made"] = made
        self._results[planned.workdir] = result
        return result

    def check_runs(self) -> None:
        """Refuse (RunError, one line) a workdir whose runs are of another config than this
        suite plans: before an unbound workdir (an earlier version's) is bound to this plan."""
        from loire_jax.config.loader import run_config_from_dict

        got = chosen(self.root, self.suite)
        planned = suites.sweep_runs(self.suite)
        if self.suite.sweep is None or got is not None:
            planned += suites.main_runs(self.suite, got[0] if got else ())
        for p in planned:
            saved = records.read_json(self.root / p.workdir / "config.json")
            if saved is None:
                continue
            try:
                changes = records.config_differences(run_config_from_dict(saved, saved=True), p.config)
            except (ValueError, TypeError, KeyError) as err:
                changes = [f"its config.json is not one this version reads ({first_line(err)[:120]})"]
            if changes:
                raise RunError(f"{self.root / p.workdir} holds a run of another config than this suite plans "
                               f"({changes[0]}: the suite, its seeds or its sweep changed); give the suite another "
                               "--workdir, or move that run away")

    def item_of(self, phase: str, workdir: str | None = None, task: str | None = None) -> Item:
        return next(i for i in self.plan if i.phase == phase and i.workdir == workdir and i.task == task)

    def _record_failure(self, item: Item, code: int) -> None:
        if self.lead and code in (USER, FAILED):
            records.record_failure(self.root, item.key(), item.label(), code, self.last_error or "failed")

    def _succeeded(self, item: Item) -> None:
        if self.lead:
            records.clear_failure(self.root, item.key())

    def _crashed(self, item: Item, err: BaseException) -> int:
        """A bug: one line here, the traceback in the suite's directory, the item recorded."""
        log: Any = "(could not be written)"
        try:
            log = self.root / f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{item.index}.log"
            paths.write_atomic(log, traceback.format_exc())
        except OSError:
            pass
        code = self._fail(f"{item.label()}: internal error {type(err).__name__}: {first_line(err)}; traceback in "
                          f"{log}", FAILED)
        self._record_failure(item, code)
        return code

    def _one(self, planned, where: str) -> int | None:
        """Run (or resume) one planned run; None when it is over, else the exit code."""
        from loire_jax.errors import Diverged
        from loire_jax.train import hooks
        from loire_jax.train.trainer import run

        label = f"[{where}] {planned.workdir}"
        if (done := self.outcome(planned)) is not None:
            self.say(f"{label}: {'diverged' if done['diverged'] else 'finished'} earlier")
            return None
        t = time.perf_counter()
        self.say(f"{label}: {planned.config.name}", flush=True)
        workdir = self.root / planned.workdir
        try:
            result = run(planned.config, workdir, mesh=self.mesh, progress=self.progress,
                         hooks=hooks.default_hooks(planned.config, progress=self.progress), report=False)
        except Diverged as err:  # a result, not a reason to stop: it fails the gate and the suite goes on
            if self.lead:
                paths.write_atomic(workdir / DIVERGED, json.dumps({"config": planned.config.to_dict(),
                                                                   "error": str(err)}))
            self.say(f"{label}: diverged ({err}); recorded, it counts as failing the sanity gate", flush=True)
            self._made(planned)
            return None
        except OSError as err:  # before USER_ERRORS: a PathError is the filesystem's, as any OSError
            return self._fail(f"{planned.workdir}: {os_reason(err)}; rerun the same command to resume", ENVIRONMENT)
        except USER_ERRORS as err:
            return self._fail(f"{planned.workdir}: {err}", USER)
        if not result.complete:
            self.say(f"stopped in {planned.workdir}; rerun the same command to resume the suite")
            return result.exit_code
        res = self._made(planned)
        self.say(f"{label}: done in {time.perf_counter() - t:.0f} s; final AP {res['AP'][-1]:.2f}, "
              f"gate {'pass' if res['gate']['passed'] else 'FAIL'}", flush=True)
        return None

    def _made(self, planned) -> dict[str, Any]:
        """The finished run's result, and its ``made.json``: where it was made, what it cost."""
        res = self.outcome(planned)
        if self.lead and res is not None:
            flops = res["flops"] if res["flops"] and all(f is not None for f in res["flops"]) else None
            records.write_made(self.root / planned.workdir, planned.config, wall_s=res["breakdown"]["total"],
                               flops=float(sum(flops)) if flops else None, gate=res["gate"],
                               diverged=res["diverged"],
                               made=records.where(self.device() if self.device is not None else None))
            res["made"] = records.read_made(self.root / planned.workdir)
        return res

    def _finetune(self, planned, task: str, where: str) -> int | None:
        """Fine-tune one run's final model on one task (its seed the run's); None when done,
        else the exit code. A run that diverged has no final model to fine-tune; one that
        failed the sanity gate is fine-tuned, and the report does not count it."""
        from loire_jax.downstream.finetune import finetune

        label = f"[{where}] {planned.workdir} {task}"
        if self.outcome(planned).get("diverged"):
            self.say(f"{label}: skipped (the run diverged)")
            return None
        t = time.perf_counter()
        try:
            got = finetune(self.root / planned.workdir, task, overrides=self.suite.downstream.overrides,
                           seeds=[planned.seed], mesh=self.mesh, log=lambda line: None)
        except OSError as err:
            return self._fail(f"{planned.workdir} {task}: {os_reason(err)}; rerun the same command to resume",
                              ENVIRONMENT)
        except USER_ERRORS as err:
            return self._fail(f"{planned.workdir} {task}: {err}", USER)
        if not got.complete:
            self.say(f"stopped in {planned.workdir} ({task}); rerun the same command to resume the suite")
            return 130 if got.stopped == 2 else 75
        seed = got.seeds[0]
        self.say(f"{label}: {'done earlier' if seed.skipped else f'done in {time.perf_counter() - t:.0f} s'}; "
              f"{seed.metric} {seed.score:.2f}", flush=True)
        return None

    def _failed_result(self, planned, failure: dict[str, Any]) -> dict[str, Any]:
        """A run that failed (bad input, a bug) in the report: over, never counted."""
        return {"name": planned.config.name, "kind": planned.config.model.kind, "finished": False, "diverged": None,
                "failed": failure, "AP": [], "AP+": [], "init_AP": [], "previous_final_AP": [], "flops": [],
                "wall_s": [], "replay_tokens": [], "gate": {"margin": self.suite.gate_margin, "stages": [],
                                                            "passed": False}, "breakdown": {}}

    def _report(self, main, setting, why, sweep_rows) -> int:
        from loire_jax.analysis import comparison, readings
        from loire_jax.analysis.downstream import read_baselines, read_scores
        from loire_jax.config.loader import load_finetune_config
        from loire_jax.experiments.growth_contrast import growth_contrast
        from loire_jax.experiments.suite import windowed_systems
        from loire_jax.store.checkpoints import stage_digest

        results: dict[str, list] = {}
        loire_rows = {readings.reading_name("LOIRE", r) for r in readings.READINGS}
        ds = self.suite.downstream
        tasks = [load_finetune_config(t, ds.overrides).job_name for t in ds.tasks] if ds else []
        for planned in main:
            done = self.outcome(planned)
            if done is None:
                failure = records.read_failure(self.root, self.item_of("main", planned.workdir).key()) or {}
                results.setdefault(planned.system, []).append(self._failed_result(planned, failure))
                continue
            result = dict(done)
            if tasks and planned.system in ds.systems:
                result["downstream"] = read_scores(self.root / planned.workdir, tasks, len(planned.config.stages),
                                                   planned.seed, checkpoint_digest=stage_digest)
                result["downstream_baseline"] = read_baselines(self.root / planned.workdir, tasks,
                                                               len(planned.config.stages), planned.seed)
            # Fig. 4's growth step, from LOIRE's own checkpoints under either reading of its window
            if planned.system in loire_rows and result["finished"] and not result.get("diverged"):
                result["growth_contrast"] = growth_contrast(self.root / planned.workdir, self.mesh)
            results.setdefault(planned.system, []).append(result)
        meta = {"name": self.suite.name, "seeds": list(self.suite.all_seeds), "setting": list(setting), "why": why,
                "margin": self.suite.gate_margin, "entropy": self.entropy, "downstream_tasks": tasks,
                "windowed": windowed_systems()}
        if not self.lead:
            return 0
        loire = next((p for p in main if p.system == "LOIRE" and self.outcome(p) is not None), None)
        meta.update(vocabulary_overlap=suite_figures.overlap(self.suite, self.say),
                    attention=suite_figures.attention(loire, self.root, self.say))
        out = comparison.write(self.root / "report", meta, results, sweep_rows)
        self.say(f"report: {out / 'report.md'}")
        judged = comparison.judged_readings(results, tasks, meta["windowed"])
        for i, end in enumerate(judged["end"]):
            start = f"; recovery: start {judged['start'][i]['verdict']}" if "start" in judged else ""
            self.say(f"  {end['verdict']:>18}: {end['claim']} ({end['where']}){start}")
        return 0


class Experiment(Pieces):
    """The plan's order: the whole suite in one process (``run``), or the items an array
    task names (``run_items``), each waiting for what it needs (``Waiting``)."""

    def _sweep_rows(self, sweep, require: bool) -> list[dict[str, Any]]:
        """The sweep's results, for the choice and the report. ``require``: every sweep run must
        be over, else Waiting names those that are not (and the failed ones with their line)."""
        rows, missing = [], []
        for planned in sweep:
            result = self.outcome(planned)
            if result is None:
                missing.append(planned)
                continue
            rows.append({"setting": list(planned.setting), "system": planned.system,
                         "final_ap": result["AP"][-1] if result["AP"] else None,
                         "gate_passed": result["gate"]["passed"]})
        if missing and require:
            raise Waiting(self._waiting_line(self.item_of("choice"), [self.item_of("sweep", p.workdir) for p in missing]))
        return rows

    def _waiting_line(self, item: Item, missing: Sequence[Item]) -> str:
        failed = [(m, records.read_failure(self.root, m.key())) for m in missing]
        failed = [(m, f) for m, f in failed if f is not None]
        why = "; ".join(f"item {m.index} failed (exit {f.get('code')}): {f.get('error')}" for m, f in failed[:2])
        return (f"item {item.index} ({item.label()}) waits for item(s) {plans.span([m.index for m in missing])} "
                f"({', '.join(m.label() for m in missing[:3])}{' ...' if len(missing) > 3 else ''}), not done in "
                f"{self.root}" + (f"; {why}: fix it and rerun that item" if why else
                                  "; run them first (launch/slurm_suite.sh chains the phases), --status shows where "
                                  "they are"))

    def _choose(self, sweep) -> tuple[tuple[str, ...], str, list[dict[str, Any]]]:
        """The sweep's winner, written to suite.json (the choice item's work)."""
        rows = self._sweep_rows(sweep, require=True)
        setting, why = suites.choose_setting(self.suite, {(tuple(r["setting"]), r["system"]): r for r in rows})
        if sweep:
            self.say(f"setting: {' '.join(setting)} ({why})")
        if self.lead:
            paths.write_atomic(self.root / SUITE_FILE, json.dumps(
                {"suite": self.suite.name, "setting": list(setting), "why": why,
                 "grid": [list(s) for s in self.suite.sweep.settings()] if self.suite.sweep else None}, indent=1))
        return setting, why, rows

    def setting(self, item: Item | None = None) -> tuple[tuple[str, ...], str]:
        """The setting every run shares: the base's without a sweep, else the choice's; before
        the choice exists, Waiting names it (never a silent default)."""
        if self.suite.sweep is None:
            return (), "no sweep: the base config's setting"
        got = chosen(self.root, self.suite)
        if got is None:
            choice = self.item_of("choice")
            what = f"item {item.index} ({item.label()})" if item is not None else "this item"
            raise Waiting(f"{what} waits for the sweep's choice, item {choice.index}: {self.root / SUITE_FILE} does "
                          f"not exist yet; run item {choice.index} once items {plans.span(choice.needs)} are done "
                          "(launch/slurm_suite.sh chains the phases)")
        return got

    # ------------------------------------------------------------------ the whole suite
    def run(self) -> int:
        """Every item in order, stopping at the first that does not finish."""
        sweep = suites.sweep_runs(self.suite)
        self._at: Item | None = None  # the item under way, whose crash is recorded
        try:
            self.entropy  # noqa: B018  (the gate's bar, before the first run: prepares the corpus)
            code = self._in_order([(self.item_of("sweep", p.workdir), partial(self._one, p)) for p in sweep], "sweep")
            if code is not None:
                return code
            self._at = self.item_of("choice") if sweep else None
            setting, why, rows = self._choose(sweep)
            main = suites.main_runs(self.suite, setting)
            code = self._in_order([(self.item_of("main", p.workdir), partial(self._one, p)) for p in main], "run")
            if code is not None:
                return code
            code = self._in_order([(self.item_of("finetune", p.workdir, task), partial(self._finetune, p, task))
                                   for p, task in suites.downstream_jobs(self.suite, main)], "downstream")
            if code is not None:
                return code
            self._at = self.item_of("report")
            return self._report(main, setting, why, rows)
        except OSError as err:  # before USER_ERRORS: a PathError is the filesystem's, as any OSError
            return fail(f"{os_reason(err)}; finished runs are kept: fix this and rerun the same command", ENVIRONMENT)
        except USER_ERRORS as err:
            return fail(err)
        except Exception as err:  # a bug: one line, the traceback in a file
            if self._at is None:
                raise
            return self._crashed(self._at, err)

    def _in_order(self, work: Sequence[tuple[Item, Callable[[str], int | None]]], name: str) -> int | None:
        """Each (item, its run) of ``work`` in order, how each ended recorded; the first that
        does not finish stops the rest, and its code is returned."""
        for i, (item, go) in enumerate(work):
            self._at = item
            code = go(f"{name} {i + 1}/{len(work)}")
            if code is not None:
                self._record_failure(item, code)
                return code
            self._succeeded(item)
        return None

    # ------------------------------------------------------------------ items
    def run_items(self, chosen_items: Sequence[Item]) -> int:
        """The items a job array's task names, in order, each as the whole suite runs it;
        stops at the first that does not finish and returns its code."""
        for item in chosen_items:
            self.say(f"item {item.index}/{len(self.plan) - 1}: {item.label()}", flush=True)
            try:
                code = self.item(item)
            except Waiting as err:
                return fail(err)
            except OSError as err:
                code = self._fail(f"{item.label()}: {os_reason(err)}; rerun the same command", ENVIRONMENT)
            except USER_ERRORS as err:
                code = self._fail(f"{item.label()}: {first_line(err)}", USER)
            except Exception as err:  # a bug: one line, the traceback in a file, the item recorded
                return self._crashed(item, err)
            if code is not None:
                self._record_failure(item, code)
                return code
            self._succeeded(item)
        return 0

    def item(self, item: Item) -> int | None:
        """One item: None when it is over, else the exit code (Waiting if it cannot start)."""
        if item.phase == "sweep":
            planned = next(p for p in suites.sweep_runs(self.suite) if p.workdir == item.workdir)
            return self._one(planned, f"item {item.index}")
        if item.phase == "choice":
            self._choose(suites.sweep_runs(self.suite))
            return None
        if item.phase == "main":
            setting, _ = self.setting(item)
            planned = next(p for p in suites.main_runs(self.suite, setting) if p.workdir == item.workdir)
            return self._one(planned, f"item {item.index}")
        if item.phase == "finetune":
            setting, _ = self.setting(item)
            planned = next(p for p in suites.main_runs(self.suite, setting) if p.workdir == item.workdir)
            if self.outcome(planned) is None:
                raise Waiting(self._waiting_line(item, [self.plan[item.needs[0]]]))
            return self._finetune(planned, item.task, f"item {item.index}")
        setting, why = self.setting(item)
        main = suites.main_runs(self.suite, setting)
        missing = [self.item_of("main", p.workdir) for p in main if self.outcome(p) is None
                   and records.read_failure(self.root, self.item_of("main", p.workdir).key()) is None]
        missing += [i for i in self.plan if i.phase == "finetune" and not self._finetune_over(i, main)]
        if missing:
            raise Waiting(self._waiting_line(item, missing))
        sweep_rows = self._sweep_rows(suites.sweep_runs(self.suite), require=False)
        return self._report(main, setting, why, sweep_rows) or None

    def ready(self, item: Item) -> None:
        """Waiting, at once and before any device starts, if ``item`` cannot run yet: a main
        run or fine-tuning before the choice, a fine-tuning before its run, the choice before
        the sweep. Read from the runs' records alone (no corpus, no devices)."""
        if item.phase in ("main", "finetune"):
            setting, _ = self.setting(item)
            if item.phase == "finetune":
                planned = next(p for p in suites.main_runs(self.suite, setting) if p.workdir == item.workdir)
                if not self._over(planned):
                    raise Waiting(self._waiting_line(item, [self.plan[item.needs[0]]]))
        elif item.phase == "choice":
            missing = [self.item_of("sweep", p.workdir) for p in suites.sweep_runs(self.suite) if not self._over(p)]
            if missing:
                raise Waiting(self._waiting_line(item, missing))

    def _over(self, planned) -> bool:
        """Whether a run is over, from its ``made.json`` or else its records (no gate needed)."""
        from loire_jax.analysis.reports import ReportError, load_run, summarize

        workdir = self.root / planned.workdir
        if records.read_made(workdir, planned.config) is not None:
            return True
        try:
            run, recs = load_run(workdir)
        except (ReportError, ValueError, OSError):
            return False
        saved = records.read_json(workdir / DIVERGED)
        return bool(saved and saved.get("error")) or \
            summarize(run, recs)["totals"]["stages_finished"] == len(run.stages)

    def _finetune_over(self, item: Item, main) -> bool:
        """A fine-tuning is over when its result is written, its run diverged (nothing to
        fine-tune), or it or its run failed (recorded)."""
        from loire_jax.config.loader import load_finetune_config

        if records.read_failure(self.root, item.key()) is not None:
            return True
        if records.read_failure(self.root, self.plan[item.needs[0]].key()) is not None:
            return True
        planned = next(p for p in main if p.workdir == item.workdir)
        done = self.outcome(planned)
        if done is None:
            return False
        if done.get("diverged"):
            return True
        job = load_finetune_config(item.task, self.suite.downstream.overrides).job_name
        return (self.root / item.workdir / "finetune" / job / f"stage{len(planned.config.stages)}"
                / f"seed{planned.seed}" / "results.json").exists()
