"""Spot checks of a suite record: ``--reproduce NAME --runs RUN,...`` reruns only the named runs
of the suite (the keys of the record's ``runs.json``: ``runs/LOIRE/seed1``,
``sweep/lr=0.003,init_std=0.01/GPT_L``) and compares every logged step of each with the
record's digest, in minutes where the whole suite takes hours.

Each run is planned as the recorded command planned it (its ``--suite``, ``--seeds``,
``--dry-run``, ``--stages`` and ``--mesh``; a main run with the setting the record's
``suite.json`` chose), its config written to a file that must read back as the same config,
and run by ``python launch/train.py`` into a temporary workdir. Everything is read and
planned before the first run starts: a missing or damaged record, or a name the record does
not hold, is refused in one line.

Loaded from its file by docs_figures.py after figures_records.py (tools is no package).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from figures_folder import RecordError, read_json, shown
from figures_records import RECORDINGS, RESULTS, ROOT, load, suite_differences, suite_runs


def run_names(text: str) -> list[str]:
    """``--runs``: comma-separated run names, as runs.json spells them."""
    names = [part.strip().strip("/") for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError("--runs names at least one run of the suite record, e.g. runs/LOIRE/seed1")
    return list(dict.fromkeys(names))


def _recorded_command(command: str) -> argparse.Namespace:
    """The suite options of the command a record ran (record.json's ``command``)."""
    parser = argparse.ArgumentParser(add_help=False)
    for flag in ("--suite", "--seeds", "--stages", "--mesh"):
        parser.add_argument(flag, default=None)
    parser.add_argument("--dry-run", action="store_true")
    args, _ = parser.parse_known_args(shlex.split(command)[2:])  # after "python launch/experiment.py"
    return args


def plan(name: str, runs: list[str]) -> tuple[list[tuple[str, Any]], str, dict[str, Any]]:
    """The named runs of suite record NAME as (run, config) pairs, the mesh they ran on, and
    the record's digests of them; refused in one line before anything runs."""
    from loire_jax.experiments import suite as suites

    if not RECORDINGS[name].suite:
        raise RecordError(f"--runs picks runs of a suite record ({', '.join(n for n, s in RECORDINGS.items() if s.suite)}); "
                          f"{name} records one command: reproduce it whole, without --runs")
    recorded = load(name)["record"]
    digests = read_json(RESULTS / name / "runs.json")
    unknown = [run for run in runs if run not in digests]
    if unknown:
        known = sorted(digests)
        raise RecordError(f"{shown(RESULTS / name / 'runs.json')} holds no run {', '.join(unknown)}; its runs are "
                          f"named like {', '.join(known[:3])} ({len(known)} in all)")
    args = _recorded_command(str(recorded.get("command", "")))
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    suite = suites.load_suite(args.suite or name, seeds)
    if args.dry_run:
        suite = suites.dry_run(suite)
    if args.stages:
        suite = suites.first_stages(suite, int(args.stages))
    chosen = RESULTS / name / "suite.json"
    setting = tuple(read_json(chosen).get("setting") or ()) if chosen.exists() else ()
    sweep = suites.sweep_runs(suite) if any(run.startswith("sweep/") for run in runs) else []
    main = suites.main_runs(suite, setting) if any(not run.startswith("sweep/") for run in runs) else []
    planned = {p.workdir: p for p in [*sweep, *main]}
    gone = [run for run in runs if run not in planned]
    if gone:
        raise RecordError(f"suite {suite.name} no longer plans {', '.join(gone)}, which its record holds: the suite "
                          "changed since it was recorded, so the record cannot be spot-checked; reproduce it whole")
    mesh = args.mesh or suites.base_config(suite).mesh
    return [(run, planned[run].config) for run in runs], str(mesh), {run: digests[run] for run in runs}


def reproduce_runs(name: str, runs: list[str]) -> list[str]:
    """Rerun the named runs of suite record NAME and compare each with its digest; returns the
    differences (the record is left as it is)."""
    from loire_jax.config.loader import load_run_config

    selected, mesh, want = plan(name, runs)
    with tempfile.TemporaryDirectory(prefix=f"loire-{name}-runs-") as tmp:
        root, configs = Path(tmp) / "suite", Path(tmp) / "configs"
        configs.mkdir()
        files = []
        for i, (run, config) in enumerate(selected):
            path = configs / f"{i}.yaml"  # JSON is YAML
            path.write_text(json.dumps(config.to_dict(), indent=1))
            if load_run_config(path).to_dict() != config.to_dict():
                raise RecordError(f"{run}: its config does not read back the same from a file, so launch/train.py "
                                  "cannot rerun it as the suite ran it; reproduce the record whole")
            files.append(path)
        diffs = []
        for (run, _config), path in zip(selected, files):
            command = [sys.executable, "launch/train.py", "--config", str(path), "--workdir", str(root / run),
                       "--mesh", mesh, "--compile-cache", str(Path(tmp) / "xla")]
            print(f"{name}: rerunning {run}", file=sys.stderr, flush=True)
            done = subprocess.run(command, cwd=ROOT, capture_output=True)
            got = suite_runs(root).get(run)
            if got is None:  # a run that diverged in the record stops the same way here, and is compared
                tail = " ".join(done.stderr.decode(errors="replace").strip()[-500:].split())
                diffs.append(f"{run}: python launch/train.py exited {done.returncode} with no metrics: {tail}")
                continue
            diffs += suite_differences({run: got}, {run: want[run]})
    return diffs
