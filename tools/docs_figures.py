"""The figures README.md and docs/*.md quote, rendered from recorded runs, so that none goes stale.

    python tools/docs_figures.py --check            # exit 1 if a quoted figure differs from its record
    python tools/docs_figures.py --write            # rewrite the quoted figures from the records
    python tools/docs_figures.py --record NAME      # rerun NAME's command here and record it anew
    python tools/docs_figures.py --reproduce NAME   # rerun it in a temporary workdir and compare its
                                                    # deterministic figures with the record (nothing written)
    python tools/docs_figures.py --reproduce paper-mini --runs runs/LOIRE/seed1,runs/GPT_L/seed2
                                                    # a suite record's spot check: only the named runs

A record is a folder ``docs/results/NAME/``: ``record.json`` (the command as typed, the
commit and version that ran it, the machine, the wall time, the exit code), the command's
``stdout.txt`` and ``stderr.txt`` (progress-bar redraws collapsed to what a terminal shows
last) and the run's own files (``config.json``, ``metrics.jsonl``, ``report/report.json``).
Its marker ``.loire_record`` lists the files the tool wrote: ``--record`` replaces those and
refuses, before running anything, a folder holding any other (figures_folder.py says why).
A missing or damaged record file is one line naming it (exit 2), and ``--reproduce`` reads
the record before it runs anything.

A benchmark's figures come from its ``--json`` file in ``benchmarks/results/`` instead (``bench:NAME``).
``--measure NAME`` prints a small measurement (Hugging Face import, XLA's FLOPs, float64 growth)
that a record runs as its command.

In README.md and docs/*.md a figure sits between ``<!-- figures:NAME -->`` and ``<!-- /figures -->``; the
text between the markers is exactly what ``render(NAME)`` returns. Wall times are quoted as
what they are, one measurement on the recorded machine; AP, AP+, Init - Prev final, the
FLOPs, the perplexity log and the growth deviations are deterministic, and the two recorded
default runs must agree on them (``--check`` says so if they do not).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, Callable

from loire_jax.cli.scripts import neighbour
from loire_jax.errors import LoireError

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))  # the files that may hold figure markers
MARKER = re.compile(r"<!-- figures:([\w-]+) -->(.*?)<!-- /figures -->", re.S)


def _script(name: str):
    """A neighbour module (figures_records.py), loaded from its file: tools is no package, and
    this script runs from any directory and is loaded from its file by the tests; the later
    ones import the earlier ones by name."""
    return neighbour(__file__, name)


# Its pieces, by what each owns, in the order they import each other:
text = _script("figures_text")  # how a figure reads: durations, numbers, the command and machine, wrapped prose
folder = _script("figures_folder")  # a record's folder: its marker and the files the tool wrote, reading them
records = _script("figures_records")  # the recorded commands: recording, reading and reproducing one
spot = _script("figures_spot")  # --reproduce NAME --runs: a few runs of a suite record rerun
measures = _script("figures_measures")  # --measure NAME: the Hugging Face import, XLA's FLOPs, growth in float64
runs = _script("figures_runs")  # single runs: the default run, the growth demo, LOIRE-GPT2, LOIRE-Bert, the corpus
suites = _script("figures_suites")  # comparison suites: paper-mini's verdicts, systems and Table 5
bench = _script("figures_bench")  # the CPU benchmarks: throughput, memory, encoder vs decoder, the data pipeline
compile_time = _script("figures_compile")  # GPT_L vs LOIRE compile time
accelerator = _script("figures_accelerator")  # README's Performance section and the GPU table
cost = _script("figures_cost")  # --suite paper on H100s: GPU-hours and wall time, from the GPU records and the plan

# The names its callers use (tests/test_docs.py).
RECORDINGS, load, demo_rows = records.RECORDINGS, records.load, records.demo_rows

# Every figure the docs may quote, by the NAME of its markers, and the family that renders it.
FIGURES: dict[str, Callable[[text.Got], str]] = {
    "default-run-log": runs.fig_default_run_log,
    "default-run-report": runs.fig_default_run_report,
    "default-run-wall": runs.fig_default_run_wall,
    "grow-demo": runs.fig_grow_demo,
    "gpt2": runs.fig_gpt2,
    "bench-throughput": bench.fig_bench_throughput,
    "bench-memory": bench.fig_bench_memory,
    "flops-xla": measures.fig_flops_xla,
    "hf-import": measures.fig_hf_import,
    "growth-f64": measures.fig_growth_f64,
    "data-prepare": runs.fig_data_prepare,
    "bench-data": bench.fig_bench_data,
    "bench-compile": compile_time.fig_bench_compile,
    "readme-performance": accelerator.fig_readme_performance,
    "bert-tiny-report": runs.fig_bert_tiny_report,
    "bench-encoder": bench.fig_bench_encoder,
    "paper-mini": suites.fig_paper_mini,
    "paper-mini-verdicts": suites.fig_paper_mini_verdicts,
    "bert-mini": suites.fig_bert_mini,
    "paper-cost": cost.fig_paper_cost,
    "suite-index": cost.fig_suite_index,
}


def render(name: str) -> str:
    """The text between NAME's markers, from the records alone."""
    cache: dict[str, dict[str, Any]] = {}

    def got(rec: str) -> dict[str, Any]:
        if rec not in cache:
            cache[rec] = load(rec)
        return cache[rec]

    return "\n" + FIGURES[name](got) + "\n"


def quoted(text: str) -> dict[str, str]:
    """NAME -> the text between its markers in one document."""
    return {m.group(1): m.group(2) for m in MARKER.finditer(text)}


def problems() -> list[str]:
    """Every way the docs and the records disagree, one line each (none: all figures hold)."""
    out = []
    seen = set()
    for doc in DOCS:
        if not doc.exists():
            continue
        for name, text in quoted(doc.read_text()).items():
            seen.add(name)
            if name not in FIGURES:
                out.append(f"{doc.relative_to(ROOT)}: figures:{name} is no figure this script renders "
                           f"({', '.join(FIGURES)})")
                continue
            try:
                rendered = render(name)
            except ValueError as err:  # a record that cannot give the figure; a damaged one stops the check
                if isinstance(err, LoireError):
                    raise
                out.append(f"{doc.relative_to(ROOT)}: figures:{name} cannot be rendered: {err}")
                continue
            if text != rendered:
                out.append(f"{doc.relative_to(ROOT)}: figures:{name} differs from its record; "
                           "python tools/docs_figures.py --write renders it")
    out += [f"figures:{name} is quoted nowhere in {', '.join(str(d.relative_to(ROOT)) for d in DOCS)}"
            for name in FIGURES if name not in seen]
    out += [f"docs/results/{problem}" for name, spec in RECORDINGS.items() if spec.corpus
            for problem in records.corpus_problems(name, load(name)["stderr"])]
    first, warm = load("default-run-first"), load("default-run")
    a, b = records.run_figures(first["report"], first["stdout"]), records.run_figures(warm["report"], warm["stdout"])
    out += [f"the two recorded default runs differ in {key}: {a[key]} vs {b[key]}" for key in a if a[key] != b[key]]
    return out


def write() -> list[str]:
    """Re-render every marked figure in place; returns the documents changed."""
    changed = []
    for doc in DOCS:
        if not doc.exists():
            continue
        text = doc.read_text()
        new = MARKER.sub(lambda m: f"<!-- figures:{m.group(1)} -->{render(m.group(1))}<!-- /figures -->"
                         if m.group(1) in FIGURES else m.group(0), text)
        if new != text:
            doc.write_text(new)
            changed.append(str(doc.relative_to(ROOT)))
    return changed



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--check", action="store_true", help="exit 1 if a quoted figure differs from its record")
    group.add_argument("--write", action="store_true", help="rewrite the quoted figures from the records")
    group.add_argument("--record", choices=sorted(RECORDINGS), help="rerun a recorded command and record it anew")
    group.add_argument("--reproduce", choices=sorted(RECORDINGS),
                       help="rerun a recorded command and compare its deterministic figures with the record")
    group.add_argument("--measure", choices=sorted(measures.MEASURES), help="print a measurement a record runs")
    parser.add_argument("--runs", type=spot.run_names, default=None, metavar="RUN,...",
                        help="with --reproduce of a suite record: rerun only these runs (names as in its runs.json)")
    args = parser.parse_args(argv)
    if args.runs is not None and not args.reproduce:
        parser.error("--runs goes with --reproduce NAME of a suite record; it picks that record's runs")
    if args.measure:
        measures.MEASURES[args.measure]()
        return 0
    try:
        if args.record:
            print(f"recorded: {records.record(args.record)}")
            return 0
        if args.reproduce:
            if args.runs is not None:
                diffs = spot.reproduce_runs(args.reproduce, args.runs)
            else:
                diffs = records.reproduce(args.reproduce)
            for line in diffs:
                print(f"differs: {line}", file=sys.stderr)
            note = records.other_cpu(args.reproduce) if diffs else None
            if note:
                print(f"note: {note}", file=sys.stderr)
            same = "every step of the named runs equals the record's" if args.runs else \
                "the deterministic figures equal the record's"
            if not diffs:
                print(f"reproduced: {same}")
            return 1 if diffs else 0
        if args.write:
            changed = write()
            print(f"rewrote figures in {', '.join(changed)}" if changed else "every figure was current")
        found = problems()
    except LoireError as err:  # a record missing, damaged or not replaceable (folder.RecordError), a suite that
        # no longer loads: one line, the user's to fix
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for line in found:
        print(f"error: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
