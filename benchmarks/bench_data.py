"""Tokens/s of the training data pipeline (median over repeats).

Usage: python benchmarks/bench_data.py [--data-dir DIR] [--config YAML] [--seq-len 128]
       [--batch 16] [--batches 2000] [--repeats 5] [--domain -1] [--replay 0.1]

Measures what the trainer sees: next() on the grain iterator (packed windows, shuffle,
replay mixture, batching, prefetch thread), counting seq_len+1 tokens per row.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from loire_jax.config.loader import load_data_config
from loire_jax.config.stream import StreamSpec
from loire_jax.data import DataConfig, DataError, train_iterator
from loire_jax.errors import fail


def run_once(cfg: DataConfig, domain: int, seq_len: int, batch: int, n: int, replay: float,
             seed: int, threads: int) -> float:
    stream = StreamSpec(domain, seq_len=seq_len, global_batch_size=batch, seed=seed, replay_ratio=replay)
    it = train_iterator(cfg, stream, num_threads=threads)
    next(it)  # start-up (thread pool, memmaps) is not throughput
    t0 = time.perf_counter()
    for _ in range(n):
        b = next(it)
    dt = time.perf_counter() - t0
    assert b["tokens"].shape == (batch, seq_len + 1)
    return n * batch * (seq_len + 1) / dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "configs/domains/default.yaml"))
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--domain", type=int, default=-1, help="default: the last domain")
    ap.add_argument("--replay", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    try:
        for flag in ("seq_len", "batch", "batches", "repeats", "threads"):
            if getattr(args, flag) < 1:
                raise ValueError(f"--{flag.replace('_', '-')} must be a positive integer, got {getattr(args, flag)}")
        if not 0.0 <= args.replay < 1.0:
            raise ValueError(f"--replay must be in [0, 1), got {args.replay}")
        cfg = load_data_config(args.config)
        if args.data_dir:
            cfg = cfg.with_data_dir(args.data_dir)
        if not -len(cfg.domains) <= args.domain < len(cfg.domains):
            raise ValueError(f"--domain must be in {-len(cfg.domains)}..{len(cfg.domains) - 1} for the "
                             f"{len(cfg.domains)} domains of {args.config}, got {args.domain}")
        domain = args.domain % len(cfg.domains)
        rates = [run_once(cfg, domain, args.seq_len, args.batch, args.batches, args.replay, seed=r,
                          threads=args.threads) for r in range(args.repeats)]
    except (DataError, ValueError) as err:  # ConfigError is both
        return fail(err)
    print(f"domain={cfg.domains[domain].name} seq_len={args.seq_len} batch={args.batch} "
          f"replay={args.replay} threads={args.threads} batches/repeat={args.batches}")
    print("tokens/s per repeat: " + ", ".join(f"{r:,.0f}" for r in rates))
    print(f"median pipeline tokens/s: {statistics.median(rates):,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
