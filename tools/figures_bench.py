"""The benchmarks' figures on the CPU: the train step's throughput beside PyTorch eager, the
compiled step's memory, the encoder against the decoder and the data pipeline's tokens/s.
They read ``bench_step.py --json`` files (``bench:NAME``) and ``bench_data.py``'s record.

Loaded from its file by docs_figures.py after figures_text.py (tools is no package: the
imports below find it by name).
"""

from __future__ import annotations

import re
from typing import Any

from figures_text import Got, cmd, on, prose, thousands

from loire_jax.analysis.tables import markdown_table

# (label, default vocabulary) of bench_step.py's shapes: configuration, not measurement
SHAPES = {"tiny": ("tiny (128, 512, 8, 4)", 8192), "m1": ("paper M1 (384, 1024, 6, 6)", 50257),
          "m5": ("paper M5 (768, 2048, 12, 12)", 50257), "1b": ("1.1B final stage (2048, 6144, 32, 24)", 50257)}


def bench_rows(rows: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    """The rows of a ``--json`` file that match every given field; a missing one is an error."""
    found = [r for r in rows if all(r[k] == v for k, v in match.items())]
    if not found:
        raise ValueError(f"no benchmark row has {match}")
    return found


def fig_bench_throughput(got: Got) -> str:
    m1, tiny = got("bench:cpu-m1-target"), got("bench:cpu-tiny")
    (r,) = bench_rows(m1["rows"], shape="m1", teachers=0)
    label, vocab = SHAPES["m1"]
    rows = [[f"{label}, {r['vocab'] or vocab}, {r['dtype']}", f"{r['batch']} × {r['seq']}", "0",
             f"{thousands(r['tokens_per_s'])} ({100 * r['mfu']:.1f}% MFU)", thousands(r["torch_tokens_per_s"])]]
    for dtype, name in (("float32", None), ("bfloat16", "tiny, bf16 compute")):
        found = sorted(bench_rows(tiny["rows"], shape="tiny", dtype=dtype), key=lambda row: row["teachers"])
        label, vocab = SHAPES["tiny"]
        name = name or f"{label}, {found[0]['vocab'] or vocab}, {dtype}"
        rows.append([name, f"{found[0]['batch']} × {found[0]['seq']}",
                     " / ".join(str(row["teachers"]) for row in found),
                     " / ".join(thousands(row["tokens_per_s"]) for row in found),
                     " / ".join(thousands(row["torch_tokens_per_s"]) for row in found)])
    table = markdown_table(("shape (h, f, heads, L), vocab", "batch × seq", "teachers", "loire_jax tokens/s",
                            "PyTorch eager tokens/s"), rows)
    return prose(
        "Measured on this project's 2-core CPU machine, one device, by the two commands below; "
        f"the records are `{m1['path']}` and `{tiny['path']}` (torch {r['torch_version']}). Each figure is the "
        "median of the benchmark's repeats in one sitting on a shared machine, not a promise:"
    ) + "\n" + "\n".join(table) + "\n"


def fig_bench_memory(got: Got) -> str:
    rec = got("bench:cpu-compile-remat-dots")
    rows = []
    for shape in ("m1", "m5", "1b"):
        found = sorted(bench_rows(rec["rows"], shape=shape, dtype="bfloat16", remat="dots", compile_only=True),
                       key=lambda row: row["teachers"])
        label, vocab = SHAPES[shape]
        rows.append([f"{label}, {found[0]['vocab'] or vocab}", f"{found[0]['batch']} × {found[0]['seq']}",
                     *(f"{row['compiled_peak_gib']:.2f} GiB" for row in found)])
    table = markdown_table(("shape", "batch × seq", "0 teachers", "1 teacher", "4 teachers"), rows)
    return prose(
        f"Memory of the compiled bf16 step with `remat=dots` (the GPU and TPU default), from XLA's memory "
        f"analysis on CPU with XLA attention and {rec['rows'][0]['loss_chunk']}-token loss blocks (`--shapes "
        "m1,m5,1b --teachers 0,1,4 --dtypes float32,bfloat16 --compile-only --remat dots --loss-chunk 1024 "
        f"--json`; recorded in `{rec['path']}`); cuDNN attention on a GPU needs less:"
    ) + "\n" + "\n".join(table) + "\n"


def fig_bench_encoder(got: Got) -> str:
    rec = got("bench:cpu-encoder-vs-decoder")
    rows = []
    for shape in ("tiny", "m1"):
        dec, = bench_rows(rec["rows"], shape=shape, kind="decoder", teachers=0)
        enc, = bench_rows(rec["rows"], shape=shape, kind="encoder", teachers=0)
        label, vocab = SHAPES[shape]
        rows.append([f"{label}, {dec['vocab'] or vocab}, {dec['batch']} × {dec['seq']}",
                     thousands(dec["tokens_per_s"]), thousands(enc["tokens_per_s"]),
                     f"{enc['tokens_per_s'] / dec['tokens_per_s']:.2f}"])
    table = markdown_table(("shape (h, f, heads, L), vocab, batch × seq", "decoder tokens/s", "encoder tokens/s",
                            "encoder / decoder"), rows)
    return prose(
        "The encoder's train step against the paper's decoder of the same shape, float32 on one CPU device, "
        "measured one after the other in one sitting by `python benchmarks/bench_step.py --shapes tiny,m1 --kinds "
        "decoder,encoder --batch 8 --seq 256 --vocab 8192 --mesh 1 --repeats 5 --json` (median of 5 repeats of 10 "
        "steps; "
        f"recorded in `{rec['path']}`, on a machine shared with other jobs). The encoder adds its MLM transform "
        "and draws its masks on the device, and runs its output layer at the masked positions only:"
    ) + "\n" + "\n".join(table) + "\n"


def fig_bench_data(got: Got) -> str:
    rec = got("bench-data")
    setting = re.search(r"^domain=(\S+) seq_len=(\d+) batch=(\d+) replay=(\S+) threads=\d+ batches/repeat=(\d+)$",
                        rec["stdout"], re.M)
    runs = re.search(r"^tokens/s per repeat: (.+)$", rec["stdout"], re.M).group(1).split(", ")
    median = re.search(r"^median pipeline tokens/s: (\S+)$", rec["stdout"], re.M).group(1)
    domain, seq, batch, replay, n = setting.groups()
    return prose(
        f"{cmd(rec)} ({domain} domain with {replay} replay, seq_len {seq}, batch {batch}, {int(n):,} batches × "
        f"{len(runs)} repeats): a median of {median} tokens/s, {on(rec)} (`docs/results/bench-data`).")
