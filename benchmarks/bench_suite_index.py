"""What a suite's items cost run one process each (a job array's tasks) over the same items
run by one process: the per-index overhead (issue 54: under 2 s on a 2-core machine).

Usage: python benchmarks/bench_suite_index.py [--repeats 3] [--items 4] [--json PATH]

A micro suite (GPT_L and LOIRE, two stages of a few steps, on the test fixtures' text, no
download) is run warm: its corpus prepared and its programs in a compilation cache of its
own (a first, untimed pass). Then, from the same warm state, into fresh workdirs:
- one process runs items 0..N-1 (``launch/experiment.py --index 0-3``);
- N processes run them one each (``--index 0``, ``--index 1``, ...), one after another, as
  an array's tasks on one node would.
Both do the same work (the same runs, compiled programs loaded from the same cache); what
the N processes do more is N-1 times the per-index part: the process and its imports, JAX's
start, loading the suite and its plan, the workdir and binding checks, the run's lock taken
and released. ``overhead = (N processes - one process) / (N - 1)``, the median over repeats.
That difference is more than the suite's part: each process also starts Python and JAX, and
traces its programs again and loads them from the cache, which one process does once for
every run of the same shapes. So it also times
- an item that is already done (``finished earlier``), one process: the process, its imports
  and JAX's start, the suite's plan and checks, no compiling or training;
- the suite's own part of an index in this process (what issue 54 bounds at 2 s: the plan,
  the checks, the lock and its release; no process start, no compiling or training): load
  the suite and number its plan, resolve the index, check the workdir's plan and that the
  item may start, take the workdir, read whether its run is over, take and release its
  run's lock, for each item of the finished workdir.
Each process's CPU seconds (user + system, its children's) are kept beside its wall time:
on a shared machine the wall time grows with the load, the CPU time much less.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "data" / "fixtures"


def _suite(base: Path) -> Path:
    """The micro suite's files in ``base``: GPT_L and LOIRE at seeds 1 and 2, two stages of 4 steps."""
    domain = lambda name, f: {"name": name, "source": {"kind": "local", "paths": [str(FIXTURES / f)]}}  # noqa: E731
    config = {
        "name": "bench", "batch_size": 8, "seq_len": 16, "precision": "float32", "seed": 0, "mesh": "1",
        "model": {"preset": "paper", "vocab_size": 320, "max_seq_len": 16, "hidden": 16, "ffn": 32, "heads": 2,
                  "head_dim": 8, "layers": 1},
        "data": {"data_dir": str(base / "data"), "tokenizer": {"kind": "trained_bpe", "vocab_size": 320},
                 "validation_docs": 10, "split_seed": 0, "recovery_fraction": 0.1,
                 "domains": [domain("SCI", "science.txt"), domain("NEWS", "news.jsonl")]},
        "optimizer": {"name": "adam", "lr": 1.0e-2, "schedule": "cosine", "warmup_steps": 1, "clip_norm": 1.0},
        "checkpoint": {"save_every": 0, "keep": 1}, "eval": {"every": 0, "batches": 1},
        "stages": [{"name": "A", "domains": ["SCI"], "steps": 4},
                   {"name": "B", "domains": ["NEWS"], "steps": 4, "growth": [{"op": "hidden", "size": 32}],
                    "warmup_steps": 2, "teachers": "all", "replay_ratio": 0.25, "beta": 0.1, "beta_steps": 1}]}
    (base / "bench.yaml").write_text(yaml.safe_dump(config))
    (base / "suite.yaml").write_text(yaml.safe_dump({"name": "bench", "base": "bench.yaml", "systems": ["GPT_L", "LOIRE"],
                                                     "seeds": [1, 2]}))
    return base / "suite.yaml"


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _experiment(suite: Path, workdir: Path, cache: Path, *args: str) -> tuple[float, float]:
    """One ``launch/experiment.py`` process; its wall and CPU seconds (a failure stops the benchmark)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    t, cpu = time.perf_counter(), _cpu()
    done = subprocess.run([sys.executable, str(ROOT / "launch" / "experiment.py"), "--suite", str(suite),
                           "--workdir", str(workdir), "--compile-cache", str(cache), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    seconds, cpu = time.perf_counter() - t, _cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return seconds, cpu


def _suite_part(suite: Path, workdir: Path, indices: list[int]) -> list[float]:
    """The suite's own part of each index, in this process: what ``launch/experiment.py --index I``
    does around the run (cli/experiment.py's order), the run's lock and its release included."""
    from loire_jax.cli.experiment import _take
    from loire_jax.experiments import plan as plans
    from loire_jax.experiments import suite as suites
    from loire_jax.experiments.runner import Experiment
    from loire_jax.store.locks import WorkdirLock

    seconds = []
    for index in indices:
        t = time.perf_counter()
        loaded = suites.load_suite(str(suite))
        source = str(suites.suite_path(str(suite)).resolve())
        (item,) = plans.resolve(plans.items(loaded), [index], "--index", loaded, None)
        plans.check_binding(workdir, loaded, source, write=False)
        Experiment(loaded, workdir).ready(item)
        root = _take(workdir, loaded, source)
        experiment = Experiment(loaded, root)
        setting, _ = experiment.setting(item)
        planned = next(p for p in suites.main_runs(loaded, setting) if p.workdir == item.workdir)
        if experiment.outcome(planned) is None:
            raise SystemExit(f"error: item {index} of {workdir} is not over; the benchmark measures a finished one")
        lock = WorkdirLock(root / item.workdir, doing="bench_suite_index.py")
        lock.acquire()
        lock.release()
        seconds.append(time.perf_counter() - t)
    return seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--items", type=int, default=4, help="main items 0..N-1 of the micro suite (at most 4)")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args(argv)
    if not 2 <= args.items <= 4 or args.repeats < 1:
        print("error: --items takes 2 to 4 (the micro suite's main runs), --repeats a positive integer",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="loire-bench-index-") as tmp:
        base = Path(tmp)
        suite, cache = _suite(base), base / "xla"
        indices = list(range(args.items))
        span = f"0-{args.items - 1}"
        _experiment(suite, base / "warm", cache, "--index", span)  # corpus prepared, programs cached
        one, each, done, part = [], [], [], []
        for r in range(args.repeats):
            one.append(_experiment(suite, base / f"one{r}", cache, "--index", span))
            runs = [_experiment(suite, base / f"each{r}", cache, "--index", str(i)) for i in indices]
            each.append((sum(w for w, _ in runs), sum(c for _, c in runs)))
            done.append(_experiment(suite, base / "warm", cache, "--index", "0"))  # finished earlier: no run
            part += _suite_part(suite, base / "warm", indices)
    overhead = [(e - o) / (args.items - 1) for (e, _), (o, _) in zip(each, one)]
    overhead_cpu = [(e - o) / (args.items - 1) for (_, e), (_, o) in zip(each, one)]
    median = statistics.median
    result = {"items": args.items, "repeats": args.repeats, "one_process_s": [w for w, _ in one],
              "one_process_cpu_s": [c for _, c in one], "one_per_item_s": [w for w, _ in each],
              "one_per_item_cpu_s": [c for _, c in each], "overhead_per_index_s": overhead,
              "median_overhead_s": median(overhead), "overhead_per_index_cpu_s": overhead_cpu,
              "median_overhead_cpu_s": median(overhead_cpu), "done_item_s": [w for w, _ in done],
              "done_item_cpu_s": [c for _, c in done], "median_done_item_s": median(w for w, _ in done),
              "median_done_item_cpu_s": median(c for _, c in done), "suite_part_s": part,
              "median_suite_part_s": median(part), "max_suite_part_s": max(part),
              "load_average": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
              "python": sys.version.split()[0]}
    print(f"{args.items} items, one process: {median(w for w, _ in one):.1f} s; one process each: "
          f"{median(w for w, _ in each):.1f} s; per-index overhead {result['median_overhead_s']:.2f} s wall "
          f"(runs: {', '.join(f'{x:.2f}' for x in overhead)}), {result['median_overhead_cpu_s']:.2f} s CPU; "
          f"an item already done: {result['median_done_item_s']:.2f} s wall, "
          f"{result['median_done_item_cpu_s']:.2f} s CPU; the suite's part of an index: "
          f"{result['median_suite_part_s']:.3f} s (at most {result['max_suite_part_s']:.3f}); "
          f"load average {result['load_average'][0]}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
