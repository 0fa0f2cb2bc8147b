"""The paper's measurements for one or more runs: ``python launch/report.py WORKDIR [WORKDIR ...]``.

Reads each workdir's ``config.json`` and ``metrics.jsonl`` and writes, to ``--out``:
    report.md      AP/AP+ (Table 2), Init/Final PPL, per-domain PPL (Table 10),
                   cost per stage (Table 9) and, for several runs, cost ratios of the
                   first run to each other run (Table 4)
    report.json    the same numbers, plus the loss/gate/beta curves the plots use
    ap.png, ppl_heatmap.png, init_final.png, training.png

The default ``--out`` is WORKDIR/report for one run and reports/<name>_vs_<name>... for
several. ``launch/train.py`` calls this at the end of every completed run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PLOTS = ("ap", "ppl_heatmap", "init_final", "training")


class ReportError(Exception):
    """A workdir that cannot be reported on; printed without a traceback."""


def load_run(workdir: Path):
    """(RunConfig, records) of one workdir; a torn last line (a killed writer) is skipped."""
    from loire_jax.run_config import RunConfig

    config, metrics = workdir / "config.json", workdir / "metrics.jsonl"
    if not config.exists() or not metrics.exists():
        raise ReportError(f"{workdir} is not a run workdir: it needs config.json and metrics.jsonl "
                          "(written by launch/train.py)")
    run = RunConfig.from_dict(json.loads(config.read_text()))
    records, bad = [], []
    lines = metrics.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict) and "kind" in record:
            records.append(record)
        elif i != len(lines) - 1:  # a torn last line is a killed writer's, and expected
            bad.append(i + 1)
    if bad:
        print(f"warning: {metrics}: skipped {len(bad)} malformed line(s) ({', '.join(map(str, bad[:5]))}"
              f"{' ...' if len(bad) > 5 else ''}); the report leaves those records out", file=sys.stderr)
    return run, records


def write_report(workdirs: Sequence[Path], out: Path | None = None) -> Path:
    """Writes report.md, report.json and the PNG plots; returns the output directory."""
    from loire_jax.reports import compare, figures, markdown, summarize

    workdirs = [Path(w) for w in workdirs]
    summaries = []
    for w in workdirs:
        run, records = load_run(w)
        summary = summarize(run, records, name=run.name)
        summary["workdir"] = str(w)
        summaries.append(summary)
    names = [s["name"] for s in summaries]
    if len(set(names)) < len(names):  # same config name twice: tell them apart by workdir
        for s, w in zip(summaries, workdirs):
            s["name"] = f"{s['name']}@{w.name}"
    if out is None:
        out = workdirs[0] / "report" if len(workdirs) == 1 else \
            Path("reports") / "_vs_".join(s["name"].replace("/", "_") for s in summaries)
    out.mkdir(parents=True, exist_ok=True)
    comparisons = compare(summaries) if len(summaries) > 1 else []
    (out / "report.md").write_text(markdown(summaries, comparisons))
    (out / "report.json").write_text(json.dumps({"runs": summaries, "comparisons": comparisons}, indent=1))
    import matplotlib.pyplot as plt

    for stem, fig in figures(summaries).items():
        fig.savefig(out / f"{stem}.png", dpi=110)
        plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdirs", nargs="+", type=Path, help="run workdirs; the first is compared to the others")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        out = write_report(args.workdirs, args.out)
    except (ReportError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"report: {out / 'report.md'} (+ report.json, {', '.join(p + '.png' for p in PLOTS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
