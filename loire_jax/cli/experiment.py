"""The paper's comparisons as one command: every baseline and ablation, every seed, one report.

    python launch/experiment.py --suite paper-mini|bert-mini|PATH.yaml [--list] [--seeds 1,2,3]
                                [--workdir DIR] [--mesh M] [--compile-cache DIR|auto|off] [--dry-run]
                                [--stages N]
    python launch/experiment.py --suite S --plan                  the numbered plan, each phase's index range
    python launch/experiment.py --suite S --workdir DIR --index I one planned item (also $SLURM_ARRAY_TASK_ID,
                                                                  $JOB_COMPLETION_INDEX; --phase P counts from P's first)
    python launch/experiment.py --suite S --workdir DIR --status  every item: done, running, failed, waiting ...
    python launch/experiment.py --suite S --workdir DIR --merge DIR2 [DIR3 ...]   runs made elsewhere, brought in

A suite (``configs/suites/<name>.yaml``) derives every system from one LOIRE config
(``loire_jax.experiments.systems``), so all of them see the same data order, seeds, tokens per stage
and evaluation batches. The sweep runs first and picks the one setting all systems share;
then every system runs at every seed; then ``report/report.md`` gives AP and AP+ per
stage, Init versus Final, cost ratios, where the wall time went and a verdict on each of
the paper's claims. Rerunning the command skips finished runs and resumes a killed one.
The workdir is the experiment's own (``.loire_experiment``): a new or empty directory, or
one an experiment made; any other is refused before anything is written. It holds one
suite's plan (``plan.json``): another suite file or seed list on it is refused.

On a cluster, each planned item is one index (``loire_jax.experiments.plan``): sweep runs,
the choice, main runs, fine-tunings, the report. ``launch/slurm_suite.sh`` submits the phases
as SLURM job arrays, each after the one before; an item run before what it needs exits at
once with one line naming it. ``--merge`` brings finished runs from other workdirs of the
same suite, each checked against the plan before anything is copied.

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
import os
import sys
import time

from loire_jax.cli import devices, usage
from loire_jax.errors import ENVIRONMENT, PEER_LOST, LoireError, PeerLost, command, fail, first_line


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


def _parser() -> argparse.ArgumentParser:
    parser = usage.parser(__doc__)
    parser.add_argument("--suite", default="paper-mini", help="a suite name in configs/suites, or a YAML path")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--list", action="store_true", help="print every system's resolved config and exit")
    mode.add_argument("--plan", action="store_true",
                      help="print the numbered plan: each phase's index range and array size, then every item")
    mode.add_argument("--status", action="store_true",
                      help="where every planned item stands in --workdir, and the time left (reads only)")
    mode.add_argument("--merge", nargs="+", metavar="DIR", default=None,
                      help="bring the finished runs of these workdirs of the suite into --workdir, each checked "
                           "against the plan first; then the report, once every run is there")
    parser.add_argument("--index", default=None, metavar="I",
                        help="run planned item I only (a range 0-5 or a list 0-5,8 runs them in order); default: "
                             "$SLURM_ARRAY_TASK_ID or $JOB_COMPLETION_INDEX if set, else the whole suite")
    parser.add_argument("--phase", default=None, choices=("sweep", "choice", "main", "finetune", "report"),
                        help="count the index from this phase's first item (a Kubernetes Indexed Job per phase)")
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
    devices.add_process_flags(parser)
    return parser


@command()
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _main(args)
    except (ValueError, FileNotFoundError) as err:  # a suite or system refused by a check that raises ValueError
        return fail(err)


def _main(args: argparse.Namespace) -> int:
    from loire_jax.experiments import plan as plans
    from loire_jax.experiments import suite as suites

    if args.phase is not None and args.index is None and not any(os.environ.get(v) for v in plans.INDEX_VARIABLES):
        return fail("--phase counts an index from a phase's first item: give --index (or run it as an array task)")
    suite = suites.load_suite(args.suite, args.seeds)
    if args.dry_run:
        suite = suites.dry_run(suite)
    if args.stages is not None:
        suite = suites.first_stages(suite, args.stages)
    source = str(suites.suite_path(args.suite).resolve())
    plan = plans.items(suite)
    asked = None if (args.list or args.plan or args.status or args.merge) else plans.requested(args.index, os.environ)
    todo = plans.resolve(plan, asked[0], asked[1], suite, args.phase) if asked else None
    root = suites.workdir_for(suite, args.workdir)
    if args.status:
        return _status(suite, source, plan, root)
    from loire_jax.experiments.runner import chosen

    got = chosen(root, suite)
    if args.plan:
        if root.is_dir():
            plans.check_binding(root, suite, source, write=False)
        _print(plans.plan_lines(suite, plan, got[0] if got else None))
        return 0
    sweep = suites.sweep_runs(suite)
    main_runs = suites.main_runs(suite, got[0] if got else ())  # every system derives, or one line says why
    if args.list:
        _print_list(suite, sweep, main_runs, got)
        return 0
    if args.merge:
        return _merge(suite, source, root, args.merge)
    return _run(args, suite, source, root, todo)


def _print(lines) -> None:
    try:
        print("\n".join(lines))
        sys.stdout.flush()
    except BrokenPipeError:  # piped into head: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _print_list(suite, sweep, main_runs, got) -> None:
    try:
        _list(suite, sweep, main_runs, got)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _status(suite, source, plan, root) -> int:
    """``--status``: reads the workdir, never writes it nor takes a lock."""
    from loire_jax.experiments import plan as plans
    from loire_jax.experiments import status

    status.check_root(root)
    plans.check_binding(root, suite, source, write=False)
    _print(status.status_lines(suite, root, plan))
    return 0


def _take(root, suite, source):
    """The suite's workdir, made, marked and bound to this plan, before anything runs there.
    Array tasks start at once: one that finds the root being made by another (its marker not
    yet in place) looks again."""
    from loire_jax import outputs
    from loire_jax.experiments import plan as plans
    from loire_jax.store import workdir as rundir

    for attempt in range(5):
        try:
            taken = rundir.take_experiment_root(root)
            break
        except rundir.WorkdirError:
            being_made = root.is_dir() and all(p.name.startswith(outputs.EXPERIMENT) for p in root.iterdir())
            if attempt == 4 or not being_made:
                raise
            time.sleep(0.2 * (attempt + 1))
    if not (taken / plans.PLAN_FILE).exists():  # an earlier version's workdir: its runs must be this plan's
        from loire_jax.experiments.runner import Experiment

        Experiment(suite, taken).check_runs()
    plans.check_binding(taken, suite, source, write=True)
    return taken


def _merge(suite, source, root, sources) -> int:
    import tempfile
    from pathlib import Path

    from loire_jax.cli.logs import library_logs_to
    from loire_jax.experiments import merge
    from loire_jax.experiments.runner import Experiment

    early = Path(tempfile.gettempdir()) / f"loire-merge-{os.getpid()}.log"  # the libraries' logs until the root is ours
    library_logs_to(early)
    try:
        checked = merge.check(suite, root, sources)  # every source whole, before anything is written
        taken = _take(root, suite, source)
        library_logs_to(taken / "python.log", carry_over=early)
    finally:
        early.unlink(missing_ok=True)
    for line in merge.apply(checked, taken):
        print(line)
    experiment = Experiment(suite, taken)
    report = experiment.plan[-1]
    try:
        code = experiment.item(report)
    except LoireError as err:
        print(f"the report waits: {first_line(err)}")
        return 0
    return code or 0


def _run(args, suite, source, root, todo) -> int:
    """The whole suite, or the items ``todo`` names, on the devices."""
    from loire_jax.config.mesh import parse_mesh
    from loire_jax.experiments import suite as suites

    devices.check_environment()  # $XLA_FLAGS, $JAX_PLATFORMS: before the suite's root is taken
    base = suites.base_config(suite)
    mesh_spec = args.mesh or base.mesh
    # every system shares the base's batch: a mesh that cannot split it creates no device
    devices.check_batch(parse_mesh(mesh_spec), base.batch_size // base.microbatches,
                        "the suite's microbatch (batch_size / microbatches)")
    processes = devices.processes_from_args(args)
    trains = todo is None or any(item.runs for item in todo)
    if not trains and processes is not None and _rank(args) != 0:
        return 0  # the choice and the report are process 0's; the others have nothing to do
    from loire_jax.experiments import plan as plans
    from loire_jax.experiments.runner import Experiment
    from loire_jax.store import workdir as rundir

    if todo:  # a main run before the choice, say: one line, before the workdir is touched or any device starts
        if root.is_dir():
            plans.check_binding(root, suite, source, write=False)
        Experiment(suite, root).ready(todo[0])
    try:  # resolved (.., links), refused if it holds other work or is not an experiment's, before any device
        root = _take(root, suite, source)
    except (rundir.WorkdirError, OSError) as err:
        return fail(err)
    from loire_jax.cli.logs import library_logs_to

    if not trains:
        library_logs_to(root / "python.log")
        return Experiment(suite, root).run_items(todo)
    try:
        sizes, devs, note = devices.configure(mesh_spec, enable_x64=base.precision == "float64", processes=processes,
                                              heartbeat_s=args.heartbeat_s, xla_gpu_flags=base.xla_gpu_flags)
    except PeerLost as err:
        return fail(err, PEER_LOST)
    except (ValueError, FileNotFoundError) as err:
        return fail(err)
    except RuntimeError as err:  # jax.distributed could not reach the coordinator or the other processes
        return fail(f"joining the other processes failed: {first_line(err)[:300]}", ENVIRONMENT)
    try:
        devices.compile_cache(args.compile_cache)
    except OSError as err:
        return fail(f"compilation cache {args.compile_cache}: {err.strerror or err}")
    import jax

    from loire_jax.experiments import records
    from loire_jax.parallel.sharding import make_mesh

    lead = jax.process_index() == 0
    library_logs_to(root / ("python.log" if lead else f"python.{jax.process_index()}.log"))
    experiment = Experiment(suite, root, make_mesh(sizes, devs), progress=args.progress, failed=devices.failed,
                            lead=lead, device=records.device)
    if lead:
        if todo is None:
            extra = (f" (+{len(suite.extra_seeds.seeds)} for {len(suite.extra_seeds.systems)})"
                     if suite.extra_seeds else "")
            sweep = suites.sweep_runs(suite)
            print(f"devices: {note}; suite {suite.name}: {len(suite.planned_systems)} systems x {len(suite.seeds)} seeds"
                  f"{extra}{f' + a sweep of {len(sweep)} runs' if sweep else ''}, in {root}")
        else:
            print(f"devices: {note}; suite {suite.name}, item(s) {', '.join(str(i.index) for i in todo)} of "
                  f"{len(experiment.plan)}, in {root}")
    try:
        code = experiment.run() if todo is None else experiment.run_items(todo)
    except PeerLost as err:
        return devices.failed(err, PEER_LOST)
    if experiment.last_error is not None:  # reported through devices.failed: every process has left
        return code
    return devices.finished(code or 0)  # every process ended the same way: leave in order


def _rank(args) -> int:
    """This process's rank in a multi-process job, before JAX has joined them."""
    for value in (args.process_id, os.environ.get("JAX_PROCESS_ID"), os.environ.get("SLURM_PROCID")):
        if value is not None and str(value).strip().isdigit():
            return int(value)
    return 0


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


def entry() -> None:
    """The ``loire-experiment`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
