"""Compile time of a lifelong run: GPT_L against LOIRE, cold and from the persistent cache.

LOIRE's model changes shape at every stage, so every stage compiles; GPT_L keeps one shape.
What LOIRE must not do is compile more than its shapes need (one training step and one
evaluation per stage, ``train.program``). This benchmark runs both systems, derived from one
config as the comparison suite derives them (``experiments.systems``), three times:

1. ``--compile-cache off``: every stage compiles what it needs, nothing is loaded;
2. into an empty persistent cache (a first run with the default ``auto``): GPT_L's later
   stages load its one shape's programs from stage 1's entries;
3. again, into that warm cache (a rerun, or a resumed run).

It prints, per system and pass, the compile seconds (and their tracing/lowering share, which
no cache saves), the programs compiled, the wall time and the training FLOPs, then the
LOIRE / GPT_L ratios and each system's warm / cold ratio; ``--json`` keeps them.

    python benchmarks/bench_compile.py                               # the default run's shapes
    python benchmarks/bench_compile.py --config gpt_paper --mesh 1 stage_defaults.steps=10   # on a GPU
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from loire_jax.analysis.tables import markdown_table
from loire_jax.errors import fail

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("GPT_L", "LOIRE")
PASSES = (("off", "cache off"), ("cold", "empty cache"), ("warm", "warm cache"))
LABELS = dict(PASSES)


def _config_path(name: str) -> Path:
    """A path, or a preset's name in configs/ (``tiny``, ``gpt_paper``)."""
    path = Path(name)
    if path.suffix not in (".yaml", ".yml"):
        path = ROOT / "configs" / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"--config {name}: no such config (a YAML path or a name in configs/)")
    return path.resolve()


def write_suite(folder: Path, config: Path, overrides: list[str]) -> Path:
    """The two-system suite this benchmark runs: GPT_L and LOIRE at one seed, no sweep."""
    suite = {"name": "bench-compile", "about": "benchmarks/bench_compile.py: GPT_L vs LOIRE compile time",
             "base": str(config), "overrides": overrides, "systems": list(SYSTEMS), "seeds": [1]}
    path = folder / "suite.yaml"
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return path


def run_pass(suite: Path, workdir: Path, cache: str, mesh: str | None) -> float:
    """One suite run in a child process (a fresh process: nothing compiled in memory)."""
    cmd = [sys.executable, str(ROOT / "launch" / "experiment.py"), "--suite", str(suite), "--workdir", str(workdir),
           "--compile-cache", cache] + (["--mesh", mesh] if mesh else [])
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode}: "
                           + ((out.stderr or out.stdout).strip().splitlines() or ["no output"])[-1])
    return time.perf_counter() - t


def system_figures(workdir: Path, system: str) -> dict[str, Any]:
    """A run's compile records and the report's wall time, breakdown and FLOPs."""
    run_dir = workdir / "runs" / system / "seed1"
    compiles = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
                if r.get("kind") == "compile"]
    (report,) = json.loads((workdir / "report" / "report.json").read_text())["runs"][system]
    return {"programs": len(compiles), "compile_s": sum(r["seconds"] for r in compiles),
            "lower_s": sum(r.get("lower_seconds", 0.0) for r in compiles),
            "per_stage": [[r["stage"], r["phase"], round(r["seconds"], 3)] for r in compiles],
            "wall_s": sum(report["wall_s"]), "flops": sum(report["flops"]), "breakdown": report["breakdown"]}


def table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    return "\n".join(markdown_table(
        ("system", "pass", "programs", "compile s", "of which tracing s", "wall s", "training FLOPs"),
        [(system, LABELS[key], str(r["programs"]), f"{r['compile_s']:.1f}", f"{r['lower_s']:.1f}", f"{r['wall_s']:.1f}",
          f"{r['flops']:.3g}") for system in SYSTEMS for key in results for r in [results[key][system]]]))


def ratios(results: dict[str, dict[str, dict[str, Any]]]) -> dict[str, float]:
    """LOIRE / GPT_L compile time per pass, each system's warm / cold (where both passes ran),
    and LOIRE / GPT_L FLOPs."""
    out = {f"loire_over_gpt_l_{key}": results[key]["LOIRE"]["compile_s"] / results[key]["GPT_L"]["compile_s"]
           for key in results}
    if {"cold", "warm"} <= set(results):
        for system in SYSTEMS:
            out[f"{system}_warm_over_cold"] = results["warm"][system]["compile_s"] / results["cold"][system]["compile_s"]
    first = next(iter(results.values()))
    out["flops_loire_over_gpt_l"] = first["LOIRE"]["flops"] / first["GPT_L"]["flops"]
    return out


def summary(got: dict[str, float]) -> str:
    parts = [f"{got[f'loire_over_gpt_l_{key}']:.2f}x {LABELS[key]}" for key, _ in PASSES
             if f"loire_over_gpt_l_{key}" in got]
    line = "LOIRE / GPT_L compile: " + ", ".join(parts)
    if "LOIRE_warm_over_cold" in got:
        line += f"; warm / cold: GPT_L {got['GPT_L_warm_over_cold']:.0%}, LOIRE {got['LOIRE_warm_over_cold']:.0%}"
    return line + f"; FLOPs LOIRE / GPT_L {got['flops_loire_over_gpt_l']:.1%}"


def parse_passes(text: str) -> tuple[str, ...]:
    """``off,cold,warm`` or a subset, run in that order; warm needs cold (it reuses its cache)."""
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in keys if k not in LABELS]
    if unknown or not keys or len(set(keys)) != len(keys):
        raise ValueError(f"--passes {text}: give some of {', '.join(LABELS)}, each once")
    if "warm" in keys and "cold" not in keys:
        raise ValueError("--passes: warm reruns into the cache the cold pass filled; add cold")
    return tuple(k for k in LABELS if k in keys)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="tiny", help="the LOIRE config both systems derive from (path or name)")
    parser.add_argument("--mesh", default="1", help="device mesh of every run (default 1)")
    parser.add_argument("--steps", type=int, default=20,
                        help="steps a stage (stage_defaults.steps; default 20; 0: the config's own)")
    parser.add_argument("--passes", default="off,cold,warm", help="which passes (default off,cold,warm)")
    parser.add_argument("--workdir", default=None, help="where the runs go (default: a temporary folder, removed)")
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument("--cache-dir", default=None,
                        help="the persistent cache of the cold and warm passes (default: a new one in the workdir)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the config")
    args = parser.parse_args(argv)
    try:
        config = _config_path(args.config)
        if args.steps < 0:
            raise ValueError(f"--steps must be 0 (the config's) or a positive integer, got {args.steps}")
        passes = parse_passes(args.passes)
        if args.json and not Path(args.json).expanduser().resolve().parent.is_dir():
            raise ValueError(f"--json {args.json}: its folder does not exist")
        if args.workdir and Path(args.workdir).exists() and any(Path(args.workdir).iterdir()):
            raise ValueError(f"--workdir {args.workdir} is not empty: give a new or empty folder")
    except ValueError as err:
        return fail(err)
    with tempfile.TemporaryDirectory(prefix="bench-compile-") as tmp:
        base = Path(args.workdir) if args.workdir else Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        steps = [f"stage_defaults.steps={args.steps}"] if args.steps else []
        suite = write_suite(base, config, [*steps, *args.overrides])
        results: dict[str, dict[str, dict[str, Any]]] = {}
        seconds = {}
        try:
            for key in passes:
                label = LABELS[key]
                cache = "off" if key == "off" else (args.cache_dir or str(base / "xla"))
                seconds[key] = run_pass(suite, base / key, cache, args.mesh)
                results[key] = {s: system_figures(base / key, s) for s in SYSTEMS}
                print(f"{label}: {seconds[key]:.0f} s; compile GPT_L {results[key]['GPT_L']['compile_s']:.1f} s, "
                      f"LOIRE {results[key]['LOIRE']['compile_s']:.1f} s", flush=True)
        except (RuntimeError, OSError, KeyError, ValueError) as err:
            return fail(err)
    got = ratios(results)
    print(table(results))
    print(summary(got))
    if args.json:
        Path(args.json).write_text(json.dumps({"config": str(config), "mesh": args.mesh, "steps": args.steps,
                                               "overrides": args.overrides, "pass_seconds": seconds,
                                               "results": results, "ratios": got}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
