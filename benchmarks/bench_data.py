"""Tokens/s of the training data pipeline (median over repeats), or the cost of preparing
one very large document.

Usage: python benchmarks/bench_data.py [--data-dir DIR] [--config YAML] [--seq-len 128]
       [--batch 16] [--batches 2000] [--repeats 5] [--domain -1] [--replay 0.1]
       python benchmarks/bench_data.py --one-line-mb 50 [--vocab 8192] [--data-dir NEW_DIR]

Measures what the trainer sees: next() on the grain iterator (packed windows, shuffle,
replay mixture, batching, prefetch thread), counting seq_len+1 tokens per row.

``--one-line-mb MB`` instead prepares, from nothing, a domain whose text is one generated
line of MB megabytes (seeded words in sentences, no line break) and 40 short documents, with
a trained BPE of ``--vocab`` pieces, and reports the wall and CPU time of ``prepare`` and the
process's peak resident memory (``getrusage``: the C++ tokenizer and ArrayRecord memory
included, which ``tracemalloc`` would not see), before and during it. It builds in
``--data-dir`` (a new folder, kept) or in a temporary folder, removed afterwards.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from loire_jax.config.loader import data_config_from_dict, load_data_config
from loire_jax.config.stream import StreamSpec
from loire_jax.data import DataConfig, DataError, format_table, prepare, train_iterator
from loire_jax.errors import fail

SHORT_DOCS = 40  # beside the long line: enough documents for the splits of a stream that does not cut it


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


def write_one_line(path: Path, n_chars: int, seed: int = 0) -> None:
    """Write ``n_chars`` characters of seeded text on one line to ``path``, a chunk at a time
    (the process's peak memory is then the preparation's): sentences of 6-29 words drawn from
    30,000 made-up words with Zipf-like frequencies (a vocabulary a BPE can learn, as in real
    text), each capitalised and ended by a full stop."""
    import numpy as np

    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    freq = np.array([12.7, 9.1, 8.2, 7.5, 7.0, 6.7, 6.3, 6.1, 6.0, 4.3, 4.0, 2.8, 2.8, 2.4, 2.4, 2.2, 2.0, 2.0,
                     1.9, 1.5, 1.0, 0.8, 0.15, 0.15, 0.1, 0.07])
    words = ["".join(rng.choice(letters, size=n, p=freq / freq.sum())) for n in rng.integers(1, 12, size=30_000)]
    zipf = 1.0 / (np.arange(len(words)) + 2.7)
    left = n_chars
    with open(path, "w", encoding="ascii") as f:
        while left > 0:
            picks = iter(rng.choice(len(words), size=200_000, p=zipf / zipf.sum()))
            sentences = [" ".join(words[next(picks)] for _ in range(n)).capitalize() + "."
                         for n in rng.integers(6, 30, size=200_000 // 30)]
            chunk = (" " if left < n_chars else "") + " ".join(sentences)
            f.write(chunk[:left])
            left -= min(left, len(chunk))


def prepare_one_line(mb: float, vocab: int, data_dir: Path) -> dict:
    """Prepare the one-line domain under ``data_dir``; its time, CPU time and memory."""
    data_dir.mkdir(parents=True)
    n_chars = int(mb * 1_000_000)
    write_one_line(data_dir / "one_line.txt", n_chars)
    write_one_line(data_dir / "short.txt", 400 * SHORT_DOCS, seed=1)
    short = (data_dir / "short.txt").read_text()
    (data_dir / "short.txt").write_text("\n\n".join(short[i * 400:(i + 1) * 400] for i in range(SHORT_DOCS)))
    cfg = data_config_from_dict({
        "data_dir": str(data_dir / "data"), "tokenizer": {"kind": "trained_bpe", "vocab_size": vocab},
        "validation_docs": 4, "domains": [{"name": "LONG", "source": {
            "kind": "local", "paths": [str(data_dir / "one_line.txt"), str(data_dir / "short.txt")]}}]})
    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    summary = prepare(cfg, progress=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"chars": n_chars, "wall_s": wall, "summary": summary,
            "cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
            "rss_before_mb": before.ru_maxrss / 1024, "rss_peak_mb": after.ru_maxrss / 1024}


def one_line_main(args: argparse.Namespace) -> int:
    if not 0 < args.one_line_mb <= 10_000:
        raise ValueError(f"--one-line-mb must be in (0, 10000], got {args.one_line_mb}")
    if not 256 < args.vocab <= 65535:
        raise ValueError(f"--vocab must be in (256, 65535], got {args.vocab}")
    if args.data_dir and Path(args.data_dir).exists():
        raise ValueError(f"--data-dir {args.data_dir} exists; with --one-line-mb give a new folder to build in")
    where = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="bench-one-line-")) / "work"
    try:
        got = prepare_one_line(args.one_line_mb, args.vocab, where)
    finally:
        if not args.data_dir:
            shutil.rmtree(where.parent, ignore_errors=True)
    print(format_table(got["summary"]))
    print(f"one line of {got['chars']:,} characters + {SHORT_DOCS} short documents, BPE of {args.vocab} pieces")
    print(f"prepare: {got['wall_s']:.1f} s wall, {got['cpu_s']:.1f} s CPU; peak RSS {got['rss_peak_mb']:,.0f} MB "
          f"({got['rss_before_mb']:,.0f} MB before preparing)")
    return 0


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
    ap.add_argument("--one-line-mb", type=float, default=None,
                    help="measure preparing a generated one-line document of this many MB instead")
    ap.add_argument("--vocab", type=int, default=8192, help="with --one-line-mb: the trained BPE's pieces")
    args = ap.parse_args(argv)
    try:
        if args.one_line_mb is not None:
            return one_line_main(args)
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
