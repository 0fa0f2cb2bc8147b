"""The unrolled layer stack beside the other execution options, in one process on one GPU:
the follow-up to the accelerator check's variants part that chose ``model.scan_unroll``'s
GPU default (benchmarks/results/accelerator/README.md, 2026-11-27).

    python benchmarks/unroll_sweep.py --json OUT.jsonl            # on the GPU, about 4 minutes
    python benchmarks/unroll_sweep.py --json OUT.jsonl --dry-run  # toy shapes on the CPU

Every case is ``bench_step.py``'s exact step (M5 at 32 x 1024 bf16 without teachers, then the
1.1B final stage at 8 x 1024 unrolled and scanned), timed in one child process, in order,
within ``--timeout`` seconds: a case it does not reach is recorded with its error. Each
record is one JSON line. The cases are bench_step command lines, so any one of them can be
rerun alone as ``python benchmarks/bench_step.py ARGS``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from loire_jax.cli.scripts import neighbour

bench = neighbour(__file__, "bench_step")  # benchmarks is no package

# The GPU defaults of the sweep's record, before issue 58 (remat by memory, bf16 logits): pinned, so that
# it reruns what it recorded (a case's own flags win)
BEFORE_58 = ["--remat", "dots", "--loss-logits", "float32"]
# (bench_step arguments beyond the shape's): each a question the variants table left open
CASES = (
    ("m5", ["--scan-unroll", "12", "--remat", "none"]),        # unrolled: is remat still worth it?
    ("m5", ["--scan-unroll", "4"]),                            # partly unrolled: less memory?
    ("m5", ["--scan-unroll", "12", "--remat", "dots_names"]),  # unrolled with named activations kept
    ("m5", ["--scan-unroll", "12", "--loss-chunk", "4096"]),   # unrolled with larger loss blocks
    ("1b", ["--scan-unroll", "24"]),                           # the 1.1B stage unrolled...
    ("1b", ["--scan-unroll", "1"]),                            # ...and scanned
)
KEYS = ("shape", "batch", "scan_unroll_run", "remat_run", "loss_chunk_run", "tokens_per_s", "mfu", "compile_s",
        "compiled_peak_gib", "loss", "error")


def cases(dry: bool) -> list[dict]:
    """The sweep's bench_step cases; the dry run's at the tiny shape in float32."""
    out = []
    for shape, extra in CASES:
        argv = ["--shapes", "tiny" if dry else shape, "--teachers", "0", "--dtypes", "float32" if dry else "bfloat16",
                "--steps", "5", "--repeats", "2", *BEFORE_58, *extra]
        out.append(dict(bench.cases_of(argv)[0], argv=argv))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, help="one JSON line a case goes here")
    parser.add_argument("--timeout", type=float, default=250.0, help="seconds for every case together")
    parser.add_argument("--dry-run", action="store_true", help="toy shapes on the CPU")
    args = parser.parse_args(argv)
    start = time.monotonic()
    records = bench.jax_records(cases(args.dry_run), args.timeout)
    lines = [json.dumps({"argv": r["argv"], **{k: r.get(k) for k in KEYS}}) for r in records]
    Path(args.json).write_text("\n".join(lines) + "\n")
    print("\n".join(lines) + f"\n{time.monotonic() - start:.0f} s")
    return 0 if all(r.get("tokens_per_s") for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
