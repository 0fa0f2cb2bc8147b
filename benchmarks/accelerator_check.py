"""On an accelerator, the figures README's Performance section quotes for the CPU, and more, in
one command, inside a time budget, offline.

    python benchmarks/accelerator_check.py --out DIR [--budget-min 25] [--parts step,growth,...]
    python benchmarks/accelerator_check.py --out DIR --dry-run     # the same plan at toy shapes, on CPU
    python benchmarks/accelerator_check.py --out DIR --list        # what it would run, and each part's time
    python benchmarks/accelerator_check.py --out DIR --parts step --cases m5-32x1024-t0,1b-8x1024-t0  # a short slot
    python benchmarks/accelerator_check.py --out DIR --parts step,variants --budget-min 9   # today's defaults
    python benchmarks/accelerator_check.py --out DIR --parts variants --variants "fused norm,fused gelu"

The plan, one part after another, each in child processes of this one:

- ``data``: which prepared corpora are here (nothing is ever fetched: a missing one makes
  the parts that need it say so, with the command that prepares it).
- ``step``: the train-step table of today's defaults (``bench_step.py``'s exact step, every
  ``auto`` resolved as the trainer resolves it, remat chosen by memory): paper M5 at 32 x 1024
  with 0 and 1 teacher and the 1.1B final stage at 8 x 1024 (its memory), each beside the
  same-shape torch.compile step when torch is importable (``torch_reference.py``); the JAX
  cases in one child process, the PyTorch ones in another. From it: the KD cost ratio.
  ``--cases`` keeps the named cases, and names the rows only it runs (4 teachers, 64 x 1024;
  ``--list`` names them all).
- ``variants``: M5 at 32 x 1024 as today's defaults run it (the step part's case, when it
  ran) against each candidate execution path (the fused kernels, float32 logits, loss blocks
  of 4,096, remat ``dots``) and their best combination, beside torch.compile
  (``variants.py``). ``--variants`` names others (``all``: every one).
  ``--parts step,variants`` is the table of today's defaults in one run, within 9 minutes of
  one H100 by the estimate ``--list`` prints from the H100 follow-up's records.
- ``growth``: the growth demo (``launch/grow_demo.py``), max |dlogits| after each operator.
- ``engine``: a one-stage ``launch/train.py`` run at M5's benchmark shape; its logged
  tokens/s against the benchmark's for the same shape.
- ``gpt_paper``: ``configs/gpt_paper.yaml`` (batch 64) for a few steps a stage on built-in
  data: tokens/s, MFU, compile time and compiled peak per stage and phase.
- ``gptl_vs_loire``: a short five-stage GPT_L vs LOIRE suite at the paper's shapes, run by
  ``bench_compile.py`` with the persistent cache off, into an empty cache and warm: wall time
  split (compile, growth, teachers, steps, evaluation), FLOPs, LOIRE's compile time against
  GPT_L's and a warm rerun's against a cold one.

Each part gets a share of the budget (``--budget-min``) in proportion to its estimated
cost; time a part leaves unused goes to the later ones, and a child that reaches its
allowance is killed with its process group. A part that fails or runs out of time is
recorded so, with its error's last line, and the plan goes on. ``DIR/results.json`` and
``DIR/results.md`` are rewritten after every part (and every step case), so a killed check
still leaves what it finished; each child's output is kept in ``DIR/run-*/logs``.

``--dry-run`` runs every part through the same code at toy shapes on the CPU, in about a
minute on two cores: it checks the plan, not the hardware. What it trims: two stages where
the real plan has five, a handful of steps, the test suite's fixture corpus, the toy 1.1B
row without teachers, its JAX cases in one process (and its PyTorch ones in another), and
one fresh compilation cache shared by its children, so that the programs its parts share
compile once; ``torch.compile`` uses the aot_eager backend there (inductor's C++ build
alone takes ~17 s on such a CPU). The real plan compiles cold: compile times are figures.
"""



import argparse
import dataclasses
import datetime
import importlib.util
import math
import os
import signal
import sys
import time
from pathlib import Path

from loire_jax.cli.scripts import neighbour
from loire_jax.errors import fail

MARKER = ".accelerator_check"  # in --out: this tool made the directory


def _script(name: str):
    """A neighbour script (bench_step.py), loaded from its file: benchmarks is no package."""
    return neighbour(__file__, name)


# Its pieces, by what each owns, in the order they import each other (each finds the ones
# before it in sys.modules, where _script puts them):
bench = _script("bench_step")  # a step case's measurement, the children's process groups
compile_bench = _script("bench_compile")  # the GPT_L vs LOIRE part runs it; its labels and summary are reused
variants = _script("variants")  # the variants part, step cases by name, the device and commit of the header
check_plan = _script("accelerator_plan")  # what runs at which scale, the estimates, --list, the run configs
check_results = _script("accelerator_results")  # results.json and results.md
check_runner = _script("accelerator_runner")  # the budget, the children's environment and allowances
check_parts = _script("accelerator_parts")  # each part's measurement

# The names its callers use (tests/test_accelerator_check.py, tools/figures_accelerator.py).
PARTS, REAL, DRY = check_plan.PARTS, check_plan.REAL, check_plan.DRY
step_cases, part_seconds, plan_lines = check_plan.step_cases, check_plan.part_seconds, check_plan.plan_lines
paper_config, engine_config, suite_config = check_plan.paper_config, check_plan.engine_config, check_plan.suite_config
Results, _rate, _f = check_results.Results, check_results.rate_text, check_results.figure_text
Budget, Check, Interrupted = check_runner.Budget, check_runner.Check, check_runner.Interrupted
PartError, Skipped = check_runner.PartError, check_runner.Skipped
PART_FUNCS = check_parts.PART_FUNCS


# --------------------------------------------------------------------------- the plan, part after part
def run_plan(check: Check, parts: list[str]) -> int:
    """Every selected part in order, each inside its share of what is left of the budget."""
    estimates = {p: part_seconds(p, check.scale, parts) for p in parts}
    for name in PARTS:
        if name not in parts:
            check.results.part(name).update(status="not selected")
    check.results.write()
    for i, name in enumerate(parts):
        part = check.results.part(name)
        allowance = check.budget.share(estimates[name], sum(estimates[p] for p in parts[i + 1:]))
        part.update(status="running", allowance_s=round(allowance, 1), started=check_results.now())
        check.results.write()
        print(f"[{name}] allowance {allowance:.0f} s", flush=True)
        start = time.monotonic()
        try:
            part["figures"] = PART_FUNCS[name](check, Budget(allowance))
            part["status"] = "ok"
        except Skipped as why:
            part.update(status="skipped", reason=str(why))
        except PartError as err:
            part.update(status="out of time" if str(err).startswith("out of time") else "failed", error=str(err))
        except (KeyboardInterrupt, Interrupted):
            part.update(status="interrupted", seconds=round(time.monotonic() - start, 1))
            check.results.write()
            raise
        except Exception as err:  # noqa: BLE001 - a part's bug must not cost the other parts
            part.update(status="failed", error=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
        part["seconds"] = round(time.monotonic() - start, 1)
        check.results.write()
        print(f"[{name}] {part['status']} in {part['seconds']:.0f} s"
              + (f": {part.get('error') or part.get('reason')}" if part["status"] not in ("ok",) else ""), flush=True)
    bad = [p for p in parts if check.results.part(p)["status"] in ("failed", "out of time")]
    return 1 if bad else 0


# --------------------------------------------------------------------------- the command
def open_out(text: str) -> Path:
    """The output directory, created or reused: a new or empty one, or one an earlier check
    made (its marker); refused (ValueError) when it is a file or holds other things."""
    out = Path(text).expanduser()
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {text} is a file; give a directory (new, empty, or an earlier check's)")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise ValueError(f"--out {text} is a non-empty directory that no accelerator check made; give a new or "
                         "empty one (nothing in it is touched)")
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("made by benchmarks/accelerator_check.py: its results and run-* folders\n")
    return out


def selected(text: str | None) -> list[str]:
    return variants.named(text, list(PARTS), "--parts")  # the plan's order: later parts read earlier ones' results


# The flags that choose within one part: given while that part is not run, they would select
# nothing, silently (a short slot spent on the whole plan, or on nothing of what was asked).
PART_FLAGS = {"cases": "step", "variants": "variants"}


def unused(args: argparse.Namespace, parts: list[str]) -> None:
    """Refuse (ValueError, one line) a flag of ``PART_FLAGS`` whose part ``parts`` leaves out."""
    for flag, part in PART_FLAGS.items():
        if getattr(args, flag) is not None and part not in parts:
            raise ValueError(f"--{flag} chooses within the {part} part, which --parts {','.join(parts)} does not run; "
                             f"add {part} to --parts or drop --{flag}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="results.json, results.md and the runs' folders go here")
    parser.add_argument("--budget-min", type=float, default=25.0, help="wall-clock minutes for the whole plan")
    parser.add_argument("--parts", default=None, help=f"comma-separated subset of {','.join(PARTS)} (default: all)")
    parser.add_argument("--cases", default=None, help="the step part's cases to run, comma-separated names from "
                        "--list (default: all)")
    parser.add_argument("--variants", default=None, help="the variants part's execution variants to time, "
                        "comma-separated names from --list; the plain step always runs (default: all)")
    parser.add_argument("--dry-run", action="store_true", help="the same plan at toy shapes on the CPU")
    parser.add_argument("--list", action="store_true", help="print the plan (shapes, estimates, allowances); "
                        "run nothing")
    args = parser.parse_args(argv)
    try:
        if not (math.isfinite(args.budget_min) and args.budget_min > 0):
            raise ValueError(f"--budget-min must be a positive number of minutes, got {args.budget_min:g}")
        parts = selected(args.parts)
        unused(args, parts)
        scale = dataclasses.replace(DRY if args.dry_run else REAL, only=args.cases, variants=args.variants)
        step_cases(scale)  # --cases checked
        variants.pick(scale.variants)  # --variants checked
        if args.list:
            print("\n".join(plan_lines(scale, args.budget_min, parts)))
            return 0
        out = open_out(args.out)
        work = out / f"run-{datetime.datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}"
        (work / "logs").mkdir(parents=True)
    except ValueError as err:
        return fail(err)
    except OSError as err:
        return fail(f"--out {args.out}: {err.strerror or err}")
    import jax

    jax.config.update("jax_platforms", "cpu")  # this process only plans and reads: the accelerator is the children's
    versions = check_results.versions()
    head = {"tool": "benchmarks/accelerator_check.py",
            "command": ["python", "benchmarks/accelerator_check.py", *(sys.argv[1:] if argv is None else argv)],
            "started": check_results.now(), "dry_run": scale.dry, "budget_min": args.budget_min, "work": str(work),
            "versions": versions, "python": sys.version.split()[0], "commit": variants.commit()}
    check = Check(out, work, scale, Budget(60 * args.budget_min), Results(out, head),
                  torch=importlib.util.find_spec("torch") is not None)
    head["probed"] = variants.probe_device(bench.run_child, check.env())
    signal.signal(signal.SIGTERM, _raise_interrupted)
    print(f"accelerator check{' (dry run)' if scale.dry else ''}: parts {', '.join(parts)}; budget "
          f"{args.budget_min:g} min; results in {out}", flush=True)
    try:
        code = run_plan(check, parts)
    except (KeyboardInterrupt, Interrupted):
        print(f"interrupted; what finished is in {out / 'results.md'}", file=sys.stderr)
        return 130
    print(f"results: {out / 'results.json'} and {out / 'results.md'}")
    return code


def _raise_interrupted(signum, frame) -> None:
    raise Interrupted()


if __name__ == "__main__":
    sys.exit(main())
