"""The questions the H100 variants check of 2026-11-27 left open, in one command per round
that fits a short GPU slot (recorded: benchmarks/results/accelerator/followup-h100.jsonl).

Round 1: the 1.1B final stage (8 x 1024 bf16) scanned beside torch.compile, then unrolled as
``model.scan_unroll: auto`` runs it on GPUs; the GPU default step for paper M5 (32 x 1024
bf16, unrolled) profiled (``step_profile.py``) beside torch.compile; cuBLASLt's epilogues;
remat ``none`` with loss blocks of 4,096.
Round 2 (the default): the loss path that round 1's profile blamed, ``loss_softmax=online``
and ``loss_logits=compute`` alone, together (profiled) and with round 1's faster settings,
beside torch.compile; then the 1.1B stage with both.

    python benchmarks/gpu_followup.py --out DIR [--round 1]          # on one GPU, about 6 minutes
    python benchmarks/gpu_followup.py --out DIR --dry-run            # toy shapes on the CPU

Every case is ``bench_step.py``'s exact step in a process of its own (its torch.compile
beside it in another), in order, each within its own allowance and all within
``--budget-s``: a case it cannot finish is recorded with its error and the rest go on.
``DIR/followup.jsonl`` gets one JSON line a case as soon as it ends; ``DIR/profile`` holds
the traces.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from loire_jax.cli.scripts import neighbour

bench = neighbour(__file__, "bench_step")  # benchmarks is no package

# The GPU defaults these rounds measured, before issue 58 made remat choose by memory and the
# logits bf16 on GPUs: pinned, so that a round reruns what it recorded (a case's own flags win).
BEFORE_58 = ["--remat", "dots", "--loss-logits", "float32"]
# (label, bench_step arguments beyond the shape's, extra XLA flags, seconds allowed), by round
LOSS = ["--loss-softmax", "online", "--loss-logits", "compute"]
ROUNDS = {
    1: (
        ("1b scanned", ["--shapes", "1b", "--scan-unroll", "1", "--torch-compile"], "", 150),
        ("1b auto (unrolled)", ["--shapes", "1b"], "", 200),
        ("m5 auto (unrolled), profiled", ["--shapes", "m5", "--torch-compile", "--profile", "{out}/profile"], "", 150),
        ("m5 auto + cuBLASLt epilogues", ["--shapes", "m5"], "--xla_gpu_enable_cublaslt=true", 90),
        ("m5 auto, remat none, loss 4096", ["--shapes", "m5", "--remat", "none", "--loss-chunk", "4096"], "", 90),
    ),
    # round 1's profile: the 16 loss blocks' element-wise passes over float32 logits are 8 ms of
    # the 69 ms step, about torch.compile's whole lead (it reads bf16 logits, in fewer passes)
    2: (
        ("m5 auto", ["--shapes", "m5", "--torch-compile"], "", 110),
        ("m5 online softmax", ["--shapes", "m5", "--loss-softmax", "online"], "", 70),
        ("m5 bf16 logits", ["--shapes", "m5", "--loss-logits", "compute"], "", 70),
        ("m5 online + bf16 logits, profiled", ["--shapes", "m5", *LOSS, "--profile", "{out}/profile"], "", 75),
        ("m5 online + bf16 logits, loss 4096, remat none",
         ["--shapes", "m5", *LOSS, "--loss-chunk", "4096", "--remat", "none"], "", 70),
        ("1b auto, online + bf16 logits", ["--shapes", "1b", *LOSS], "", 100),
    ),
}
KEYS = ("label", "shape", "batch", "scan_unroll_run", "remat_run", "loss_chunk_run", "loss_softmax", "loss_logits",
        "xla_flags", "tokens_per_s", "mfu",
        "compile_s", "compiled_peak_gib", "device_peak_gib", "loss", "torch_compile_tokens_per_s",
        "torch_compile_warmup_s", "torch_compile_peak_gib", "device_kind", "error", "torch_compile_error", "seconds")


def cases(out: str, dry: bool, round_: int = 2) -> list[dict]:
    """The cases, checked by bench_step's own parser; the dry run's at the tiny shape in float32,
    its torch.compile on the aot_eager backend (where torch is importable at all)."""
    import importlib.util

    has_torch = importlib.util.find_spec("torch") is not None
    found = []
    for label, extra, flags, seconds in ROUNDS[round_]:
        argv = [*BEFORE_58] + [a.format(out=out) for a in extra] + ["--teachers", "0", "--steps", "5", "--repeats",
                                                                    "2", "--dtypes", "float32" if dry else "bfloat16"]
        if dry:
            argv[argv.index("--shapes") + 1] = "tiny"
            argv += ["--torch-backend", "aot_eager"]
            if not has_torch and "--torch-compile" in argv:
                argv.remove("--torch-compile")
        (case,) = bench.cases_of(argv)
        found.append(dict(case, label=label, xla_flags=flags, allowance_s=seconds, argv=argv))
    return found


def run(case: dict, seconds: float) -> dict:
    """One case end to end (JAX, then torch.compile where asked) within ``seconds``."""
    env = dict(os.environ)
    if case["xla_flags"]:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + case["xla_flags"]).strip()
    start = time.monotonic()
    (record,) = bench.measure([case], seconds, env)
    return dict(record, seconds=round(time.monotonic() - start, 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="followup.jsonl and the profiles go here (made if missing)")
    parser.add_argument("--budget-s", type=float, default=540.0, help="seconds for every case together")
    parser.add_argument("--dry-run", action="store_true", help="toy shapes on the CPU")
    parser.add_argument("--round", type=int, choices=sorted(ROUNDS), default=max(ROUNDS), help="which questions")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "followup.jsonl"
    deadline = time.monotonic() + args.budget_s
    records = []
    for case in cases(str(out), args.dry_run, args.round):
        left = deadline - time.monotonic()
        record = run(case, min(case["allowance_s"], left)) if left > 5 else dict(case, error="out of budget: not started")
        records.append(record)
        with jsonl.open("a") as f:
            f.write(json.dumps({k: record.get(k) for k in KEYS} | {"argv": case["argv"], "profile": record.get("profile")})
                    + "\n")
        print(json.dumps({k: record[k] for k in KEYS if record.get(k) is not None}), flush=True)
        if record.get("profile"):
            import step_profile

            print(step_profile.render(record["profile"]), flush=True)
    print(f"{len([r for r in records if r.get('tokens_per_s')])} of {len(records)} cases timed; {jsonl}")
    return 0 if all(r.get("tokens_per_s") for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
