"""Where a compiled train step's time goes: a few steps traced with JAX's profiler, the
device kernels' time summed per name and per kind (matmul, attention, copies, the rest).

``bench_step.py --profile DIR`` calls ``capture`` after its timing loop, so the trace holds
warm steps only, and keeps ``summary`` in its record: a short JSON-able table that fits
what a short GPU slot can bring back, where the whole trace (tens of MB) may not. On a GPU
the kernels are the device process's events; on a CPU, where there is no device process,
the XLA threads' ops stand in, so the dry run checks the same code.
"""

from __future__ import annotations

import collections
import gzip
import json
import re
from pathlib import Path
from typing import Any, Callable

# Kernel names by what they do (cuBLAS/cuBLASLt, cuDNN, copies); anything else is element-wise
# or reduction work XLA fused, the part of the step the GPU profile of 2026-11-24 blamed.
KINDS = (
    ("matmul", re.compile(r"^dot|gemm|nvjet|cutlass|cublas|xmma", re.I)),
    ("attention", re.compile(r"cudnn|flash|fmha|sdpa|attention", re.I)),
    ("copies", re.compile(r"memcpy|memset|copy", re.I)),
)
TOP = 30


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if pattern.search(name)), "other")


def capture(step: Callable[[], Any], steps: int, out_dir: str | Path) -> dict:
    """Trace ``steps`` calls of ``step`` (each returning something to wait on) into
    ``out_dir`` and return ``summarize``'s table of it."""
    import jax

    out_dir = Path(out_dir)
    with jax.profiler.trace(str(out_dir), create_perfetto_trace=True):
        for _ in range(steps):
            jax.block_until_ready(step())
    traces = sorted(out_dir.glob("plugins/profile/*/perfetto_trace.json.gz"))
    if not traces:
        raise RuntimeError(f"the profiler wrote no perfetto trace under {out_dir}")
    return summarize(json.loads(gzip.open(traces[-1]).read()), steps)


def summarize(trace: dict, steps: int) -> dict:
    """Per step: the kernels' time by kind and the ``TOP`` kernels by time (name, ms, count),
    and the span from the first kernel's start to the last one's end (the step's device wall)."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    meta = [e for e in events if e.get("ph") == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e.get("name") == "thread_name"}
    device = {pid for pid, name in procs.items() if name.startswith("/device:")}
    if device:
        where = "device kernels"
        ops = [e for e in events if e.get("ph") == "X" and e["pid"] in device]
    else:
        where = "host XLA ops (no device process: a CPU)"
        ops = [e for e in events if e.get("ph") == "X" and threads.get((e["pid"], e["tid"]), "").startswith("tf_XLA")
               and not e["name"].startswith(("end:", "ThreadpoolListener", "SlinkyThreadPool", "ThunkExecutor"))]
    if not ops:
        raise RuntimeError("the trace holds no kernel or XLA op events")
    total = collections.Counter()
    count = collections.Counter()
    for e in ops:
        total[e["name"]] += e.get("dur", 0.0)
        count[e["name"]] += 1
    by_kind = collections.Counter()
    for name, us in total.items():
        by_kind[kind_of(name)] += us
    span = max(e["ts"] + e.get("dur", 0.0) for e in ops) - min(e["ts"] for e in ops)
    ms = 1e-3 / steps
    return {"where": where, "steps": steps, "span_ms": span * ms, "busy_ms": sum(total.values()) * ms,
            "kinds_ms": {k: by_kind[k] * ms for k in ("matmul", "attention", "copies", "other")},
            "top": [[name, us * ms, count[name] / steps] for name, us in total.most_common(TOP)]}


def render(summary: dict) -> str:
    """The summary as a few lines of text, for a log a person reads."""
    lines = [f"profile over {summary['steps']} steps ({summary['where']}): span {summary['span_ms']:.1f} ms a step, "
             f"busy {summary['busy_ms']:.1f} ms: " + ", ".join(f"{k} {v:.1f}" for k, v in summary["kinds_ms"].items())]
    lines += [f"  {ms:8.2f} ms  x{n:<6.0f} {kind_of(name):9s} {name[:90]}" for name, ms, n in summary["top"]]
    return "\n".join(lines)
