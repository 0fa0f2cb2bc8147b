"""The paper's comparisons as one command: every baseline and ablation, every seed, one report.

    python launch/experiment.py --suite paper-mini|bert-mini|PATH.yaml [--list] [--seeds 1,2,3]
                                [--workdir DIR] [--mesh M] [--compile-cache DIR|auto|off] [--dry-run]
                                [--stages N]

A suite (``configs/suites/<name>.yaml``) derives every system from one LOIRE config
(``loire_jax.experiments.systems``), so all of them see the same data order, seeds, tokens per stage
and evaluation batches. The sweep runs first and picks the one setting all systems share;
then every system runs at every seed; then ``report/report.md`` gives AP and AP+ per
stage, Init versus Final, cost ratios, where the wall time went and a verdict on each of
the paper's claims. Rerunning the command skips finished runs and resumes a killed one.
The workdir is the experiment's own (``.loire_experiment``): a new or empty directory, or
one an experiment made; any other is refused before anything is written.

The base's model kind names the fixed-size baselines: GPT_S, GPT_L and GPT_R beside a
decoder (paper-mini), BERT_S, BERT_L and BERT_R beside an encoder (bert-mini, LOIRE-Bert);
a suite naming the other kind's is refused before anything runs.

``--dry-run`` runs the suite at toy shapes: its ``dry_run`` overrides (model, sequence,
steps, evaluation) applied after its own, named ``<suite>-dry-run`` with a workdir of that
name, so a suite sized for an accelerator is checked end to end in seconds on a CPU.
``--stages N`` cuts every run to its first N stages (named ``<suite>-firstN``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from loire_jax.cli import devices, usage
from loire_jax.errors import ENVIRONMENT, USER_ERRORS, RunError, command, fail, os_reason

DIVERGED = "diverged.json"  # in a run's workdir: the run diverged with this config (kept, not retried)


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes comma-separated integers, got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("--seeds needs at least one seed")
    return seeds


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"--stages takes a positive integer, got {text!r}")
    return value


@command()
def main(argv: list[str] | None = None) -> int:
    parser = usage.parser(__doc__)
    parser.add_argument("--suite", default="paper-mini", help="a suite name in configs/suites, or a YAML path")
    parser.add_argument("--list", action="store_true", help="print every system's resolved config and exit")
    parser.add_argument("--seeds", type=_seeds, default=None, help="e.g. 1,2,3 (default: the suite's)")
    parser.add_argument("--workdir", default=None, help="default: runs/experiments/<suite>")
    parser.add_argument("--mesh", default=None, help="device mesh for every run (default: the base config's)")
    parser.add_argument("--compile-cache", default="auto", metavar="DIR|auto|off",
                        help="persistent XLA compilation cache, as loire-train's (auto: $JAX_COMPILATION_CACHE_DIR "
                             "or ~/.cache/loire_jax/xla)")
    parser.add_argument("--progress", action="store_true", help="a progress bar per stage")
    parser.add_argument("--dry-run", action="store_true",
                        help="the suite at toy shapes (its dry_run overrides), under <suite>-dry-run")
    parser.add_argument("--stages", type=_positive, default=None, metavar="N",
                        help="only the first N stages of every run, under <suite>-firstN")
    args = parser.parse_args(argv)

    from loire_jax.config.mesh import parse_mesh
    from loire_jax.experiments import suite as suites

    try:
        suite = suites.load_suite(args.suite, args.seeds)
        if args.dry_run:
            suite = suites.dry_run(suite)
        if args.stages is not None:
            suite = suites.first_stages(suite, args.stages)
        sweep = suites.sweep_runs(suite)
        chosen = _chosen(suites.workdir_for(suite, args.workdir), suite)
        main_runs = suites.main_runs(suite, chosen[0] if chosen else ())  # every system derives, or one line says why
        if args.list:
            try:
                _list(suite, sweep, main_runs, chosen)
                sys.stdout.flush()
            except BrokenPipeError:  # piped into head: the reader has what it wanted
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        devices.check_environment()  # $XLA_FLAGS, $JAX_PLATFORMS: before the suite's root is taken
        base = suites.base_config(suite)
        mesh_spec = args.mesh or base.mesh
        # every system shares the base's batch: a mesh that cannot split it creates no device
        devices.check_batch(parse_mesh(mesh_spec), base.batch_size // base.microbatches,
                            "the suite's microbatch (batch_size / microbatches)")
        from loire_jax.store import workdir as rundir

        try:  # resolved (.., links), refused if it holds other work or is not an experiment's, before any device
            root = rundir.take_experiment_root(suites.workdir_for(suite, args.workdir))
        except (rundir.WorkdirError, OSError) as err:
            return fail(err)
        sizes, devs, note = devices.configure(mesh_spec, enable_x64=base.precision == "float64")
    except (ValueError, FileNotFoundError) as err:
        return fail(err)
    try:
        devices.compile_cache(args.compile_cache)
    except OSError as err:
        return fail(f"compilation cache {args.compile_cache}: {err.strerror or err}")
    from loire_jax.cli.logs import library_logs_to
    from loire_jax.parallel.sharding import make_mesh

    library_logs_to(root / "python.log")
    extra = f" (+{len(suite.extra_seeds.seeds)} for {len(suite.extra_seeds.systems)})" if suite.extra_seeds else ""
    print(f"devices: {note}; suite {suite.name}: {len(suite.planned_systems)} systems x {len(suite.seeds)} seeds{extra}"
          f"{f' + a sweep of {len(sweep)} runs' if sweep else ''}, in {root}")
    mesh = make_mesh(sizes, devs)
    return Experiment(suite, root, mesh, progress=args.progress).run(sweep)


def _chosen(root, suite) -> tuple[tuple[str, ...], str] | None:
    """The setting a previous session chose, if it is this suite's (suite.json)."""
    try:
        saved = json.loads((root / "suite.json").read_text())
        if suite.sweep is not None and [list(s) for s in suite.sweep.settings()] != saved.get("grid"):
            return None
        return tuple(saved["setting"]), str(saved["why"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # absent or not ours: the sweep decides
        return None


def _stage_line(stage) -> str:
    from loire_jax.config.growth_methods import growth_method, stage_phase

    parts = [f"{stage.steps} steps"]
    if stage.growth:
        parts.append("grow " + ", ".join(f"{g.op}->{g.size}" + ("" if growth_method(g.init).function_preserving
                                                                else f" ({g.init})")
                                         + (" stacked" if g.mode == "stack" else "")
                                         + (" open" if g.gate == "open" else "") for g in stage.growth))
    if stage.reset_optimizer:
        parts.append("optimizer afresh")
    grown = stage_phase(stage.growth)
    if grown is not None:
        parts.append(f"{grown.label} {getattr(stage, grown.steps_field)} steps ({grown.about})")
    if stage.recover_steps:
        parts.append(f"recover {stage.recover_steps} on the memory alone")
    if stage.warmup_steps:
        parts.append(f"warmup {stage.warmup_steps}")
    if stage.replay_ratio:
        parts.append(f"replay {stage.replay_ratio:g} from " + ("the previous domain's memory" if stage.replay_from == "previous" else "every earlier domain's memory")
                     + (" weighted by forgetting" if stage.replay_weights == "forgetting" else ""))
    if stage.distills:
        parts.append(f"KD from {stage.teachers} (beta {stage.beta:g} x {stage.beta_steps})")
    if stage.gate_ramp_steps and any(g.op == "layers" and g.gate == "closed" for g in stage.growth):
        parts.append(f"gate ramp {stage.gate_ramp_steps}")
    return f"{stage.name} [{', '.join(stage.domains)}]: " + "; ".join(parts)


def _list(suite, sweep, main, chosen) -> None:
    from loire_jax.config.schedule import prompt_ids, stage_models
    from loire_jax.experiments.systems import SYSTEMS, derive

    base = main[0].config
    o = base.optimizer
    print(f"suite {suite.name}: {suite.about}".rstrip())
    print(f"base {suite.base} {' '.join(suite.overrides)}".rstrip())
    print(f"shared: preset {base.model_preset}, vocab {base.model.vocab_size}, batch {base.batch_size} x seq "
          f"{base.seq_len}, {base.precision}, {o.name} lr {o.lr:g} ({o.schedule}, warmup {o.warmup_steps}), "
          f"init_std {base.model.init_std:g}, eval {base.eval.batches} batches/domain, mesh {base.mesh}")
    if suite.sweep:
        print(f"sweep on {', '.join(suite.sweep.systems)} at seed {suite.sweep.seed}: "
              + " | ".join(" ".join(s) for s in suite.sweep.settings()) + f" ({len(sweep)} runs)")
        print("setting: " + (f"{' '.join(chosen[0])} (chosen: {chosen[1]})" if chosen
                             else "chosen by the sweep; shown with the base config's"))
    extra = suite.extra_seeds
    more = f" (and {', '.join(map(str, extra.seeds))} for {', '.join(extra.systems)})" if extra else ""
    print(f"seeds {', '.join(map(str, suite.seeds))}{more}; {len(main)} runs; sanity gate {suite.gate_margin} nats "
          "below the unigram entropy")
    if suite.downstream is not None:
        ds = suite.downstream
        print(f"downstream (Tables 5, 11): {', '.join(ds.tasks)} on the final models of {', '.join(ds.systems)} at "
              f"every seed{' with ' + ' '.join(ds.overrides) if ds.overrides else ''}; "
              f"{len(ds.tasks) * sum(len(suite.seeds_of(s)) for s in ds.systems)} fine-tunings")
    from loire_jax.experiments.suite import base_config

    loire = _flops(derive("LOIRE", base_config(suite, chosen[0] if chosen else ())))  # each row's FLOPs beside it
    for system in suite.planned_systems:
        run = next(r.config for r in main if r.system == system)
        info = SYSTEMS[system]
        shapes = " -> ".join(f"({m.hidden},{m.ffn},{m.heads},{m.layers})" for m in _dedupe(stage_models(run)))
        flops = _flops(run)
        print(f"\n{system}: {info.what} [{info.where}]\n  model {shapes}\n  training FLOPs {flops:.3g} (analytic; "
              f"LOIRE's {loire:.3g}, {flops / loire:.1%} of it)")
        if run.domain_prompts:
            print("  domain prompts (token ids): " + ", ".join(f"{d} {t}" for d, t in prompt_ids(run).items()))
        for stage in run.stages:
            print("  " + _stage_line(stage))


def _flops(run) -> float:
    """A run's analytic training FLOPs (``analysis.flops.stage_flops``), all stages."""
    from loire_jax.analysis.flops import stage_flops
    from loire_jax.config.schedule import stage_models

    return sum(stage_flops(run, stage_models(run)))


def _dedupe(models):
    out = []
    for m in models:
        if not out or (m.hidden, m.ffn, m.heads, m.layers) != (out[-1].hidden, out[-1].ffn, out[-1].heads,
                                                                out[-1].layers):
            out.append(m)
    return out


class Experiment:
    """Carries a suite's plan out: the sweep, the choice, every run, the report."""

    def __init__(self, suite, root, mesh, progress: bool = False) -> None:
        self.suite, self.root, self.mesh, self.progress = suite, root, mesh, progress
        self.entropy: dict[str, float] = {}
        self.overlap: dict[str, Any] | None = None  # Fig. 2, from the same token counts as the entropy
        self._results: dict[str, dict[str, Any]] = {}  # workdir -> result of a run that is over

    def run(self, sweep) -> int:
        from loire_jax import paths
        from loire_jax.experiments import suite as suites

        try:
            self.entropy = self._entropy(suites.base_config(self.suite))
            sweep_rows = []
            for i, planned in enumerate(sweep):
                code = self._one(planned, f"sweep {i + 1}/{len(sweep)}")
                if code is not None:
                    return code
                result = self._outcome(planned)
                sweep_rows.append({"setting": list(planned.setting), "system": planned.system,
                                   "final_ap": result["AP"][-1] if result["AP"] else None,
                                   "gate_passed": result["gate"]["passed"]})
            setting, why = suites.choose_setting(
                self.suite, {(tuple(r["setting"]), r["system"]): r for r in sweep_rows})
            if sweep:
                print(f"setting: {' '.join(setting)} ({why})")
            paths.write_atomic(self.root / "suite.json", json.dumps(
                {"suite": self.suite.name, "setting": list(setting), "why": why,
                 "grid": [list(s) for s in self.suite.sweep.settings()] if self.suite.sweep else None}, indent=1))
            main = suites.main_runs(self.suite, setting)
            for i, planned in enumerate(main):
                code = self._one(planned, f"run {i + 1}/{len(main)}")
                if code is not None:
                    return code
            jobs = suites.downstream_jobs(self.suite, main)
            for i, (planned, task) in enumerate(jobs):
                code = self._finetune(planned, task, f"downstream {i + 1}/{len(jobs)}")
                if code is not None:
                    return code
            return self._report(main, setting, why, sweep_rows)
        except OSError as err:  # before USER_ERRORS: a PathError is the filesystem's, as any OSError
            return fail(f"{os_reason(err)}; finished runs are kept: fix this and rerun the same command", ENVIRONMENT)
        except USER_ERRORS as err:
            return fail(err)

    def _entropy(self, base) -> dict[str, float]:
        """Unigram entropy (nats) of each domain's training split: the sanity gate's bar. The
        same counts give the domains' vocabulary overlap (Fig. 2), kept in ``overlap``."""
        import numpy as np

        from loire_jax.analysis.paper_figures import overlap_top, vocabulary_overlap
        from loire_jax.data import prepare
        from loire_jax.data.pipeline import load_prepared

        prepare(base.data, progress=self.progress)
        prep = load_prepared(base.data)
        out, counted = {}, {}
        for i, d in enumerate(base.data.domains):
            counts = np.bincount(np.asarray(prep.tokens(i, "pretrain")), minlength=base.model.vocab_size)
            counted[d.name] = counts.tolist()
            p = counts[counts > 0] / counts.sum()
            out[d.name] = float(-(p * np.log(p)).sum())
        self.overlap = vocabulary_overlap(counted, overlap_top(base.model.vocab_size))
        return out

    def _attention(self, main) -> dict[str, Any] | None:
        """Fig. 5's maps of LOIRE's run at its first seed (None, with a warning line, where
        they cannot be drawn: the report holds without them)."""
        from loire_jax.errors import LoireError
        from loire_jax.experiments.attention import run_attention

        loire = next((p for p in main if p.system == "LOIRE"), None)
        if loire is None:
            return None
        try:
            return run_attention(loire.config, self.root / loire.workdir)
        except (LoireError, OSError, ValueError) as err:
            print(f"warning: the attention patterns (Fig. 5) were not drawn: {str(err).splitlines()[0]}")
            return None

    def _outcome(self, planned) -> dict[str, Any] | None:
        """The run's result if it is over (every stage evaluated, or recorded as diverged),
        else None; read once and kept. A workdir holding another config is refused: its
        numbers would pass for this one's."""
        from loire_jax.analysis.reports import ReportError, load_run
        from loire_jax.analysis.suite_results import run_result

        if planned.workdir in self._results:
            return self._results[planned.workdir]
        workdir = self.root / planned.workdir
        try:
            run, records = load_run(workdir)
        except (ReportError, ValueError, OSError):
            return None
        if run.to_dict() != planned.config.to_dict():
            raise RunError(f"{workdir} holds a run of another config than this suite plans (the suite, its seeds "
                             "or its sweep changed); give the suite another --workdir, or move that run away")
        try:
            saved = json.loads((workdir / DIVERGED).read_text())
            diverged = saved.get("error") if saved.get("config") == planned.config.to_dict() else None
        except (OSError, ValueError):
            diverged = None
        result = run_result(run, records, self.entropy, self.suite.gate_margin, diverged=diverged)
        if not result["finished"]:
            return None
        self._results[planned.workdir] = result
        return result

    def _one(self, planned, where: str) -> int | None:
        """Run (or resume) one planned run; None when it is over, else the exit code."""
        from loire_jax import paths, run
        from loire_jax.errors import Diverged
        from loire_jax.train import hooks

        label = f"[{where}] {planned.workdir}"
        if (done := self._outcome(planned)) is not None:
            print(f"{label}: {'diverged' if done['diverged'] else 'finished'} earlier")
            return None
        t = time.perf_counter()
        print(f"{label}: {planned.config.name}", flush=True)
        try:
            result = run(planned.config, self.root / planned.workdir, mesh=self.mesh, progress=self.progress,
                         hooks=hooks.default_hooks(planned.config, progress=self.progress), report=False)
        except Diverged as err:  # a result, not a reason to stop: it fails the gate and the suite goes on
            paths.write_atomic(self.root / planned.workdir / DIVERGED,
                               json.dumps({"config": planned.config.to_dict(), "error": str(err)}))
            print(f"{label}: diverged ({err}); recorded, it counts as failing the sanity gate", flush=True)
            return None
        except OSError as err:  # before USER_ERRORS: a PathError is the filesystem's, as any OSError
            return fail(f"{planned.workdir}: {os_reason(err)}; rerun the same command to resume", ENVIRONMENT)
        except USER_ERRORS as err:
            return fail(f"{planned.workdir}: {err}")
        if not result.complete:
            print(f"stopped in {planned.workdir}; rerun the same command to resume the suite")
            return result.exit_code
        res = self._outcome(planned)
        print(f"{label}: done in {time.perf_counter() - t:.0f} s; final AP {res['AP'][-1]:.2f}, "
              f"gate {'pass' if res['gate']['passed'] else 'FAIL'}", flush=True)
        return None

    def _finetune(self, planned, task: str, where: str) -> int | None:
        """Fine-tune one run's final model on one task (its seed the run's); None when done,
        else the exit code. A run that diverged has no final model to fine-tune; one that
        failed the sanity gate is fine-tuned, and the report does not count it."""
        from loire_jax.downstream.finetune import finetune

        label = f"[{where}] {planned.workdir} {task}"
        if self._outcome(planned).get("diverged"):
            print(f"{label}: skipped (the run diverged)")
            return None
        t = time.perf_counter()
        got = finetune(self.root / planned.workdir, task, overrides=self.suite.downstream.overrides,
                       seeds=[planned.seed], mesh=self.mesh, log=lambda line: None)
        if not got.complete:
            print(f"stopped in {planned.workdir} ({task}); rerun the same command to resume the suite")
            return 130 if got.stopped == 2 else 75
        seed = got.seeds[0]
        print(f"{label}: {'done earlier' if seed.skipped else f'done in {time.perf_counter() - t:.0f} s'}; "
              f"{seed.metric} {seed.score:.2f}", flush=True)
        return None

    def _report(self, main, setting, why, sweep_rows) -> int:
        from loire_jax.analysis import claims, comparison
        from loire_jax.analysis.downstream import read_baselines, read_scores
        from loire_jax.config.loader import load_finetune_config
        from loire_jax.store.checkpoints import stage_digest

        results: dict[str, list] = {}
        ds = self.suite.downstream
        tasks = [load_finetune_config(t, ds.overrides).job_name for t in ds.tasks] if ds else []
        for planned in main:
            result = dict(self._outcome(planned))
            if tasks and planned.system in ds.systems:
                result["downstream"] = read_scores(self.root / planned.workdir, tasks, len(planned.config.stages),
                                                   planned.seed, checkpoint_digest=stage_digest)
                result["downstream_baseline"] = read_baselines(self.root / planned.workdir, tasks,
                                                               len(planned.config.stages), planned.seed)
            results.setdefault(planned.system, []).append(result)
        meta = {"name": self.suite.name, "seeds": list(self.suite.all_seeds), "setting": list(setting), "why": why,
                "margin": self.suite.gate_margin, "entropy": self.entropy, "downstream_tasks": tasks,
                "vocabulary_overlap": self.overlap, "attention": self._attention(main)}
        out = comparison.write(self.root / "report", meta, results, sweep_rows)
        print(f"report: {out / 'report.md'}")
        for v in claims.verdicts(results, tasks):
            print(f"  {v['verdict']:>18}: {v['claim']} ({v['where']})")
        return 0


def entry() -> None:
    """The ``loire-experiment`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
