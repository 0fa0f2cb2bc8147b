"""The README's Performance section: the CPU figures in brief and the GPU step table of the
accelerator check copied to ``benchmarks/results/accelerator/`` (its ``results.json``), whose
rates and figures are formatted by the check's own code, so README and its results.md agree.

Loaded from its file by docs_figures.py after figures_text.py, figures_bench.py and
figures_compile.py (tools is no package: the imports below find them by name).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from figures_bench import bench_rows
from figures_compile import compile_ratios
from figures_text import Got, prose, thousands

from loire_jax.analysis.tables import markdown_table
from loire_jax.cli.scripts import script

ROOT = Path(__file__).resolve().parents[1]
# an accelerator_check.py --out folder's results.json and results.md, copied here
ACCELERATOR = ROOT / "benchmarks" / "results" / "accelerator"
CHECK_SCRIPT = ROOT / "benchmarks" / "accelerator_check.py"  # its markdown renders the GPU table
VARIANTS = "variants-h100.results.json"  # the execution variants' check that chose the GPU defaults
FOLLOWUP = "followup-h100.jsonl"  # benchmarks/gpu_followup.py's rounds: the 1.1B stage unrolled, the loss path


def _accelerator_script():
    """benchmarks/accelerator_check.py, loaded from its file (benchmarks is no package): its
    markdown is the GPU table's, so the README and the check's own results.md agree."""
    return script(CHECK_SCRIPT)


def fig_readme_performance(got: Got) -> str:
    m1, tiny, comp = got("bench:cpu-m1-target"), got("bench:cpu-tiny"), got("bench-compile")
    (r,) = bench_rows(m1["rows"], shape="m1", teachers=0)
    plain = {row["teachers"]: row for row in bench_rows(tiny["rows"], shape="tiny", dtype="float32")}
    ratios = compile_ratios(comp["stdout"])
    cpu = prose(
        f"**CPU** (2 cores; [records](docs/results.md#benchmarks)): paper M1's shape at {r['batch']} × {r['seq']} "
        f"trains at {thousands(r['tokens_per_s'])} tokens/s ({100 * r['mfu']:.1f}% MFU), PyTorch eager at "
        f"{thousands(r['torch_tokens_per_s'])}; distilling from 4 teachers costs "
        f"{plain[0]['tokens_per_s'] / plain[4]['tokens_per_s']:.2f}× a plain step (PyTorch eager "
        f"{plain[0]['torch_tokens_per_s'] / plain[4]['torch_tokens_per_s']:.2f}×). LOIRE compiles "
        f"{ratios['cache off']} GPT_L's time (cache off), and a warm rerun {ratios['LOIRE warm']} of a cold one "
        "([why](docs/performance.md#compile-time-one-program-per-stage)).")
    results = ACCELERATOR / "results.json"
    if not results.exists():
        gpu = prose(
            "**GPU**: none recorded in this release, made on a machine without an accelerator. "
            "`python benchmarks/accelerator_check.py --out DIR` measures every figure on one, PyTorch eager and "
            "torch.compile beside it ([how](docs/performance.md#every-accelerator-figure-in-one-command)).")
        return cpu + "\n" + gpu
    data = json.loads(results.read_text())
    if data.get("dry_run"):
        raise ValueError(f"{results} is a dry run's: toy shapes on a CPU are no GPU figures")
    check = _accelerator_script()
    parts = {part["name"]: part for part in data["parts"]}
    device = (data.get("device") or {}).get("kind", "an unknown device")
    at = f" at commit {data['commit'][:12]}" if data.get("commit", "unknown") != "unknown" else ""
    records = parts.get("step", {}).get("records", [])
    cut = _cut_cases(check, records)
    gpu = prose(f"**GPU**: measured {data['started'][:10]} on {device}{at} by `{' '.join(data['command'])}` "
                f"(every part: `benchmarks/results/accelerator/`).{cut}")
    rows = []
    for r in records:
        vs = (f"{r['tokens_per_s'] / r['torch_compile_tokens_per_s']:.2f}×"
              if r.get("tokens_per_s") and r.get("torch_compile_tokens_per_s") else "–")
        teachers = f"{r['teachers']} teacher{'' if r['teachers'] == 1 else 's'}"
        rows.append((f"{r['label']}, {r['batch']} × {r['seq']}, {teachers}", check._rate(r),
                     check._rate(r, "torch_compile_") if r.get("torch_compile") else "–", vs,
                     check._f(r.get("compiled_peak_gib"), ".2f")))
    table = markdown_table(("case", "loire_jax tokens/s (MFU)", "torch.compile (MFU)", "ratio", "compiled peak GiB"),
                           rows)
    return cpu + "\n" + gpu + "\n" + "\n".join(table) + "\n" + _gpu_defaults()


def _gpu_defaults() -> str:
    """What chose the GPU defaults, where recorded: the execution variants' check and the
    follow-up's rounds (their tables are in docs/performance.md), every ratio to the
    torch.compile of the same run."""
    variants, follow = ACCELERATOR / VARIANTS, ACCELERATOR / FOLLOWUP
    if not (variants.exists() and follow.exists()):
        return ""
    data = json.loads(variants.read_text())
    records = [json.loads(line) for line in follow.read_text().splitlines() if line.strip()]
    torch = {(r["round"], r["shape"]): r["torch_compile_tokens_per_s"] for r in records
             if r.get("torch_compile_tokens_per_s")}
    by_label = {r["label"]: r for r in records if r.get("tokens_per_s")}

    def ratio(label: str) -> str:
        r = by_label[label]
        return f"{r['tokens_per_s'] / torch[(r['round'], r['shape'])]:.2f}×"

    text = prose(
        "**GPU defaults** ([why](docs/performance.md#gpu-follow-up); "
        f"{data['device']['kind'].removeprefix('NVIDIA ')}, {data['started'][:10]}; × torch.compile, same run): unrolled layers "
        f"(M5 {ratio('m5 auto (unrolled), profiled')}, 1.1B {ratio('1b auto (unrolled)')}), an online softmax "
        f"(M5 {ratio('m5 online softmax')}); with bf16 logits, 4,096-token loss blocks and remat `none`, "
        f"M5 {ratio('m5 online + bf16 logits, loss 4096, remat none')}. The table of today's defaults awaits "
        "[one GPU run](docs/performance.md#todays-defaults-in-one-run).")
    return "\n" + text


def _cut_cases(check: Any, records: list[dict[str, Any]]) -> str:
    """The sentence naming the step plan's cases a recorded check did not run (a short GPU
    slot runs a few), grouped by shape and batch; empty when it ran them all."""
    ran = {(r["shape"], r["batch"], r["seq"], r["teachers"]) for r in records if r.get("tokens_per_s")}
    missing: dict[tuple[str, int, int], list[int]] = {}
    for c in check.step_cases(check.REAL):  # the plan's rows, not those only --cases runs
        if (c["shape"], c["batch"], c["seq"], c["teachers"]) not in ran:
            missing.setdefault((c["label"], c["batch"], c["seq"]), []).append(c["teachers"])
    if not missing:
        return ""
    return " Not run (cut to fit its time): " + "; ".join(
        f"{label} {b} × {s} with {' and '.join(map(str, t))} teacher{'s' if t != [1] else ''}"
        for (label, b, s), t in missing.items()) + "."

