"""The accelerator check's results: ``DIR/results.json`` and ``DIR/results.md``, rewritten
whole after every part (and every step case), so a killed check still leaves what it
finished. The header names the device, the versions and the commit; every table comes from
``analysis.tables.markdown_table``. README's GPU table (tools/figures_accelerator.py) formats its
cells with ``rate_text`` and ``figure_text``, so the README and results.md agree.

Loaded from its file by accelerator_check.py after its neighbours (benchmarks is no package:
the imports below find the scripts it loaded first).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import math
import shlex
import time
from pathlib import Path
from typing import Any

import bench_compile as compile_bench
import bench_step as bench
import variants
from accelerator_plan import PARTS

from loire_jax.analysis.tables import markdown_table
from loire_jax.paths import write_atomic


# --------------------------------------------------------------------------- the results
class Results:
    """results.json and results.md, rewritten whole after every change."""

    def __init__(self, out: Path, head: dict[str, Any]) -> None:
        self.out, self.head = out, head
        self.parts: dict[str, dict[str, Any]] = {}
        self.start = time.monotonic()

    def part(self, name: str) -> dict[str, Any]:
        return self.parts.setdefault(name, {"name": name, "status": "not run", "records": [], "figures": {}})

    def write(self) -> None:
        self.head["updated"] = now()
        self.head["seconds"] = round(time.monotonic() - self.start, 1)
        probed = self.head.get("probed") or {}
        self.head["device"] = _device(self.parts) or (probed if "kind" in probed else None)
        data = dict(self.head, parts=[self.parts[n] for n in PARTS if n in self.parts])
        write_atomic(self.out / "results.json", json.dumps(data, indent=1, default=str) + "\n")
        write_atomic(self.out / "results.md", markdown(data))


def now() -> str:
    """The time, in UTC, as the header and the parts record it."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _device(parts: dict[str, dict]) -> dict[str, Any] | None:
    """The accelerator the JAX cases ran on, as they reported it (the step part's or the
    variants')."""
    for r in [r for name in ("step", "variants") for r in parts.get(name, {}).get("records", [])]:
        if r.get("device_kind"):
            return {"devices": r.get("device"), "kind": r["device_kind"], "platform": r.get("platform"),
                    "peak_flops": r.get("peak_flops"), "peak_source": r.get("peak_source")}
    return None


def versions() -> dict[str, str | None]:
    """The installed versions that decide the figures (None: not installed)."""
    out = {}
    for name in ("jax", "jaxlib", "flax", "optax", "torch", "loire_jax"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


# --------------------------------------------------------------------------- markdown
def figure_text(v: Any, fmt: str, dash: str = "–", suffix: str = "") -> str:
    """``v`` formatted, or a dash for a figure that is missing (or not finite)."""
    return dash if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt) + suffix


def markdown(data: dict[str, Any]) -> str:
    parts = {p["name"]: p for p in data["parts"]}
    dev = data.get("device") or {}
    v = data["versions"]
    lines = [f"# Accelerator check{' (dry run: toy shapes on the CPU, not figures)' if data['dry_run'] else ''}", "",
             f"- date: {data['started']} (updated {data['updated']}, {data['seconds']:.0f} s in)",
             f"- device: {dev.get('kind', 'unknown')} ({dev.get('devices') or data.get('devices_seen', '-')})"
             + (f" (the probe: {(data.get('probed') or {})['error']})" if not dev and "error" in (data.get("probed") or {}) else "")
             + "; MFU peak: "
             + (f"{dev['peak_flops'] / 1e12:,.1f} TFLOP/s ({dev.get('peak_source')})" if dev.get("peak_flops") else "–"),
             "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val)
             + f"; commit {data.get('commit', 'unknown')}",
             f"- command: `{shlex.join(data['command'])}`; budget {data['budget_min']:g} min", "", "## Parts", ""]
    lines += markdown_table(("part", "status", "seconds", "allowance s", "note"),
                            [(p["name"], p["status"], figure_text(p.get("seconds"), ".0f"), figure_text(p.get("allowance_s"), ".0f"),
                              (p.get("error") or p.get("reason") or "").replace("|", "/")) for p in data["parts"]])
    for name, render in (("data", _md_data), ("step", _md_step), ("variants", variants.markdown), ("growth", _md_growth), ("engine", _md_engine),
                         ("gpt_paper", _md_gpt_paper), ("gptl_vs_loire", _md_suite)):
        if name in parts and (parts[name]["records"] or parts[name]["figures"]):
            lines += [""] + render(parts[name])
    return "\n".join(lines) + "\n"


def _md_data(part: dict) -> list[str]:
    def state(found: dict) -> str:
        why = found["missing"]
        return "yes" if not why else f"no: {why}; prepare: {found.get('prepare')}".replace("|", "/")

    return ["## Data", ""] + markdown_table(("corpus", "config", "prepared"), [
        (name, found["config"], state(found)) for name, found in part["figures"]["prepared"].items()])


def rate_text(r: dict, prefix: str = "") -> str:
    """A record's tokens/s with its MFU (``prefix``: the PyTorch modes'), or its error."""
    from loire_jax.analysis.flops import mfu_text

    rate, mfu = r.get(prefix + "tokens_per_s"), r.get(prefix + "mfu")
    if rate is None:
        err = r.get(prefix + "error") or (r.get("error") if not prefix else None)
        return f"error: {err[:70]}" if err else "–"
    return f"{rate:,.0f}" + (f" ({mfu_text(mfu, bool(r.get('peak_measured')))})" if mfu is not None else "")


def execution_text(r: dict) -> str:
    """How a step record ran: its execution choices as resolved (the remat one chosen by memory)."""
    remat = f"remat {r.get('remat_run')}" + (" (by memory)" if r.get("remat_by_memory") else "")
    return (f"{r.get('scan_unroll_run')} layer(s) an iteration, {remat}, {r.get('attention_run')} attention, "
            f"fused {r.get('fused_run', 'none')}, loss blocks {r.get('loss_chunk_run')} ({r.get('loss_softmax_run')} "
            f"softmax, {r.get('loss_logits_run', 'float32')} logits)")


def _md_step(part: dict) -> list[str]:
    lines = ["## Train step", "",
             "tokens/s: median of the repeats, compilation excluded; MFU of the device's peak. PyTorch: the same "
             "architecture and step (torch_reference.py), eager and torch.compile.", ""]
    rows = []
    for r in part["records"]:
        student, _ = bench._configs(r)
        dims = f" ({student.hidden}, {student.ffn}, {student.heads}, {student.layers}), V {student.vocab_size:,}"
        vs = (f"{r['tokens_per_s'] / r['torch_compile_tokens_per_s']:.2f}×"
              if r.get("tokens_per_s") and r.get("torch_compile_tokens_per_s") else "–")
        rows.append((f"{r['label']}{dims}", f"{r['batch']} × {r['seq']}", str(r["teachers"]), rate_text(r),
                     figure_text(r.get("compiled_peak_gib"), ".2f"), figure_text(r.get("device_peak_gib"), ".2f"),
                     rate_text(r, "torch_") if r.get("torch") else "–",
                     rate_text(r, "torch_compile_") if r.get("torch_compile") else "–", vs))
    lines += markdown_table(("shape (h, f, heads, L), V", "batch × seq", "teachers", "loire_jax tokens/s (MFU)",
                             "compiled peak GiB", "device peak GiB", "torch eager (MFU)", "torch.compile (MFU)",
                             "loire_jax / torch.compile"), rows)
    skipped = {r.get("torch_skipped") for r in part["records"] if r.get("torch_skipped")}
    if skipped:
        lines += ["", "PyTorch columns: " + "; ".join(sorted(skipped)) + "."]
    ran = sorted({execution_text(r) for r in part["records"] if r.get("tokens_per_s")})
    if ran:
        lines += ["", "Execution, as the trainer resolves today's defaults on this device: " + "; ".join(ran) + "."]
    kd = part["figures"].get("kd_cost") or []
    if kd:
        lines += ["", "### KD cost: step time with k teachers over without", ""] + markdown_table(
            ("shape", "batch × seq", "1 teacher", "4 teachers"),
            [(k["label"], f"{k['batch']} × {k['seq']}", figure_text(k["ratio"].get("1"), ".2f", suffix="×"),
              figure_text(k["ratio"].get("4"), ".2f", suffix="×")) for k in kd])
    memory = part["figures"].get("memory_1b") or []
    if memory:
        lines += ["", "### 1.1B memory (its final stage)", ""] + markdown_table(
            ("teachers", "compiled peak GiB", "device peak GiB", "torch.compile peak GiB"),
            [(str(m["teachers"]), figure_text(m["compiled_peak_gib"], ".2f"), figure_text(m["device_peak_gib"], ".2f"),
              figure_text(m["torch_compile_peak_gib"], ".2f")) for m in memory])
    return lines


def _md_growth(part: dict) -> list[str]:
    fig = part["figures"]
    lines = ["## Growth demo", ""] + markdown_table(
        ("model", "operator", "(h, f, heads, L)", "params", "max \\|Δlogits\\|"),
        [(r["model"], r["operator"], str(tuple(r["shape"])), f"{r['params']:,}", f"{r['max_abs_dlogits']:.2e}")
         for r in part["records"]])
    if fig:
        lines += ["", f"Max over the schedule: {fig['max_abs_dlogits']:.2e}; function "
                      f"{'preserved at every step' if fig['preserved'] else 'NOT preserved'}."]
    return lines


def _md_engine(part: dict) -> list[str]:
    e = part["figures"]
    return ["## Engine vs benchmark", ""] + markdown_table(
        ("shape (h, f, heads, L), V", "batch × seq", "dtype", "engine tokens/s", "benchmark tokens/s",
         "engine / benchmark"),
        [(f"{tuple(e['shape'])}, V {e['vocab']:,}", f"{e['batch']} × {e['seq']}", e["dtype"],
          f"{e['engine_tokens_per_s']:,.0f}", f"{e['bench_tokens_per_s']:,.0f}", f"{e['ratio']:.2f}×")]) + [
        "", f"Engine: launch/train.py, median of its logged tokens/s over {e['engine_steps']} steps after the first; "
            f"benchmark: {e['bench_source']}."]


def _md_gpt_paper(part: dict) -> list[str]:
    from loire_jax.analysis.flops import mfu_text

    fig = part["figures"]
    lines = ["## gpt_paper.yaml", "",
             (f"Batch {fig['batch']} × {fig['seq']}, {fig['steps_per_stage']} steps a stage, {fig['stages']} stages; "
              f"data: {fig['data']}.") if fig else "", ""]
    lines += markdown_table(
        ("stage", "(h, f, heads, L)", "phase", "steps (timed)", "tokens/s", "MFU", "compile s", "compiled peak GiB"),
        [(str(r["stage"]), str(tuple(r["shape"])), r["phase"], f"{r['steps']} ({r['timed_steps']})",
          figure_text(r["tokens_per_s"], ",.0f"), "–" if r["mfu"] is None else mfu_text(r["mfu"]), figure_text(r["compile_s"], ".1f"),
          figure_text(r["compiled_peak_gib"], ".2f")) for r in part["records"]])
    return lines + ["", "Timed steps: a phase's steps after its first. Compile – : the phase runs the stage's one "
                        "training program, compiled before its first phase."]


def _md_suite(part: dict) -> list[str]:
    fig = part["figures"]
    keys = ("total", "compile", "growth", "teacher_load", "teacher_forward", "steps", "eval", "other")
    split = [r for r in part["records"] if "breakdown" in r]
    compiles = [r for r in part["records"] if "pass" in r]
    lines = ["## GPT_L vs LOIRE", "",
             (f"Batch {fig['batch']} × {fig['seq']}, {fig['steps_per_stage']} steps a stage, {fig['stages']} stages, "
              f"one seed; data: {fig['data']}. Seconds of wall time ({fig['first_pass']} pass).") if fig else "", ""]
    lines += markdown_table(("system", *keys, "training FLOPs"),
                            [(r["system"], *(f"{r['breakdown'][k]:.1f}" for k in keys), f"{r['flops']:.3e}")
                             for r in split])
    if compiles:
        lines += [""] + markdown_table(
            ("system", "pass", "programs", "compile s", "of which tracing s"),
            [(r["system"], compile_bench.LABELS[r["pass"]], str(r["programs"]), f"{r['compile_s']:.1f}",
              f"{r['lower_s']:.1f}") for r in compiles])
    if fig:
        lines += ["", f"LOIRE / GPT_L: FLOPs {figure_text(fig['flops_ratio'], '.1%')}, step time {figure_text(fig['steps_ratio'], '.1%')}, "
                      f"wall {figure_text(fig['wall_ratio'], '.1%')}.", "", compile_bench.summary(fig["compile"]) + "."]
    return lines
