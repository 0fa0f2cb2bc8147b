"""The accelerator check's ``variants`` part (issue 41), and what the check needs to choose
its step cases and name its device and commit.

The element-wise half of the GPU step has candidate execution paths (docs/performance.md):
each is an execution option, proven on the CPU to compute the plain step
(tests/test_execution_variants.py). This part times the paper's M5 at 32 x 1024 bf16 under
each one, each in a process of its own, beside torch.compile in the same run; then under the
combination that looks best: the options of every variant faster than the plain step (the
fastest of each option, where two set the same one), or of every candidate where none was.
Each variant's final loss is recorded beside the plain one's: the same initial state and
batches, so on the GPU it shows a variant that changed what the step computes.

Loaded from its file by accelerator_check.py (benchmarks is no package), which passes in
what it owns: the step cases, the child runner, its error type.
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from loire_jax.analysis.tables import markdown_table

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "benchmarks" / "results" / "accelerator" / "results.json"  # the H200 check the estimate reads

# (name, options): the plain step, then one candidate each. "layers": the student's depth.
VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("plain", {}),
    ("unrolled", {"scan_unroll": "layers"}),
    ("weights cast once", {"weight_cast": "step"}),
    ("remat dots_names", {"remat": "dots_names"}),
    ("xla cudnn_norm", {"xla_gpu_flags": "cudnn_norm"}),
    ("xla triton_fusion", {"xla_gpu_flags": "triton_fusion"}),
    ("xla scheduler", {"xla_gpu_flags": "scheduler"}),
)
COMBINED = "best-looking combination"
OPTION_KEYS = ("scan_unroll", "weight_cast", "remat", "xla_gpu_flags")
WIN = 1.01  # a variant "looks better" when it is at least 1% faster than the plain step

# The estimate: the recorded H200 check's M5 32 x 1024 case (compile seconds, tokens/s,
# torch.compile's warm-up) and its per-process overhead, slowed to an H100's pace (the H100
# measured the same case at 382k tokens/s, the H200 at 427k: 0.90x), with more compile time
# for the unrolled stack (a 12-layer body instead of one).
H100_SLOWER = 1.15
COMPILE_FACTOR = {"unrolled": 2.5, COMBINED: 2.5}
FALLBACK = {"compile_s": 12.0, "tokens_per_s": 400_000.0, "torch_compile_warmup_s": 27.0, "process_s": 16.0}
DRY_SECONDS = 4.0  # a toy variant on two CPU cores


# --------------------------------------------------------------------------- step cases by name
def case_name(case: dict[str, Any], prefix: str = "") -> str:
    """A step case's name for ``--cases``: shape, batch x seq and teachers (``m5-32x1024-t0``)."""
    return f"{prefix or case['shape']}-{case['batch']}x{case['seq']}-t{case['teachers']}"


def named(text: str | None, known: list[str], flag: str, what: str = "names", hint: str = "") -> list[str]:
    """The names ``text`` lists (comma-separated), in ``known``'s order; all of them for None.
    ValueError (one line) names the known ones. ``--parts``, ``--cases`` and ``--variants``."""
    if text is None:
        return list(known)
    names = [n.strip() for n in text.split(",")]
    if not all(names) or any(n not in known for n in names):
        raise ValueError(f"{flag} takes comma-separated {what} from {known}{hint}, got {text!r}")
    return [k for k in known if k in names]


def select(cases: list[dict[str, Any]], text: str | None) -> list[dict[str, Any]]:
    """The cases named in ``text`` (comma-separated ``case_name``s), in the plan's order;
    all of them for None."""
    keep = named(text, [c["name"] for c in cases], "--cases", "step cases", " (see --list)")
    return [c for c in cases if c["name"] in keep]


# --------------------------------------------------------------------------- header: device, commit
PROBE = ("import json, jax\nfrom loire_jax.cli.scripts import script\nvariants = script({here!r})\n"
         "print('DEVICE ' + json.dumps(variants.describe(jax.devices())))")


def describe(devices: list[Any]) -> dict[str, Any]:
    """What the header says of ``devices``: count, kind, platform and the MFU peak (a CPU's
    is given by $LOIRE_CPU_PEAK_FLOPS, or else measured per case, so none here)."""
    from loire_jax.analysis import flops

    d = devices[0]
    given = d.platform == "cpu" and flops.given_cpu_peak() is not None
    peak = flops.peak_flops(devices) if d.platform != "cpu" or given else None
    return {"devices": f"{len(devices)} {d.platform} device(s)", "kind": d.device_kind, "platform": d.platform,
            "peak_flops": peak.flops if peak else None,
            "peak_source": peak.source if peak else "measured per case on a CPU"}


def probe_device(run_child: Callable, env: dict[str, str], timeout: float = 120) -> dict[str, Any]:
    """The device the children see, asked of a child (this process stays on the CPU), so
    the results name it whichever parts run; where the child could not say, its last error
    line under ``error``."""
    child = run_child([sys.executable, "-c", PROBE.format(here=str(Path(__file__).resolve()))], timeout, env, ROOT)
    found = [ln[7:] for ln in child.stdout.splitlines() if ln.startswith("DEVICE ")]
    if found:
        return json.loads(found[-1])
    lines = [ln for ln in child.stderr.splitlines() if ln.strip()]
    return {"error": lines[-1][:200] if lines else f"the probe printed nothing (exit {child.code})"}


def commit(root: Path = ROOT) -> str:
    """The checkout's commit, ``-dirty`` when tracked files differ from it; ``unknown``
    outside a git checkout (or without git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=30)
        if head.returncode:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


# --------------------------------------------------------------------------- the variants
def variant_case(base: dict[str, Any], name: str, options: dict[str, Any], layers: int) -> dict[str, Any]:
    """``base`` (the plain M5 case) under ``options``; torch runs beside the plain one only."""
    opts = {k: (layers if v == "layers" else v) for k, v in options.items()}
    plain = name == "plain"
    return dict(base, **opts, variant=name, options=opts, torch=False, torch_compile=plain and base["torch_compile"])


def combined_options(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The best-looking combination: every variant at least ``WIN`` faster than the plain
    step contributes its options, the faster first where two set the same one; none
    faster: every candidate's options (the fastest of each)."""
    plain = next((r.get("tokens_per_s") for r in records if r["variant"] == "plain"), None)
    timed = sorted((r for r in records if r["variant"] not in ("plain", COMBINED) and r.get("tokens_per_s")),
                   key=lambda r: -r["tokens_per_s"])
    winners = [r for r in timed if plain and r["tokens_per_s"] >= WIN * plain] or timed
    out: dict[str, Any] = {}
    for r in winners:
        for k, v in r["options"].items():
            out.setdefault(k, v)
    return out


def pick(text: str | None) -> tuple[str, ...]:
    """The variants ``--variants`` names (comma-separated, as the table names them), the
    plain step first whether named or not: every other row is measured against it, and
    torch.compile runs beside it. None: every one. ValueError (one line) names the known."""
    known = [v for v, _ in VARIANTS]
    names = named(text, known, "--variants")
    return tuple(v for v in known if v == "plain" or v in names)


def estimate(dry: bool, recorded: Path = RECORDED, names: tuple[str, ...] | None = None) -> tuple[float, str]:
    """(seconds on one H100, where the figures come from) for the ``names`` variants (all
    by default), the combination and torch.compile."""
    each, source = seconds_each(dry, recorded, names)
    return sum(each.values()), source


def seconds_each(dry: bool, recorded: Path = RECORDED,
                 names: tuple[str, ...] | None = None) -> tuple[dict[str, float], str]:
    """Each variant's estimated seconds (the plain one's with torch.compile beside it, the
    unrolled stack's with its longer compilation), the combination's last; and the source.
    The part shares its allowance among them in these proportions."""
    names = (names or tuple(v for v, _ in VARIANTS)) + (COMBINED,)
    if dry:
        return {v: DRY_SECONDS * (2 if v == "plain" else 1) for v in names}, "toy shapes on the CPU"
    got, source = dict(FALLBACK), "assumed figures (no recorded check in benchmarks/results/accelerator)"
    if recorded.is_file():
        data = json.loads(recorded.read_text())
        step = next((p for p in data["parts"] if p["name"] == "step"), {"records": []})
        m5 = next((r for r in step["records"] if (r["shape"], r["batch"], r["teachers"]) == ("m5", 32, 0)
                   and r.get("tokens_per_s")), None)
        if m5:
            got.update({k: m5[k] for k in ("compile_s", "tokens_per_s") if m5.get(k)})
            got["torch_compile_warmup_s"] = m5.get("torch_compile_warmup_s") or got["torch_compile_warmup_s"]
            got["process_s"] = process_seconds(step) or got["process_s"]
            source = (f"the {data['device']['kind']} check of {data['started'][:10]}: M5 compile "
                      f"{got['compile_s']:.1f} s, {got['tokens_per_s']:,.0f} tokens/s, "
                      f"{got['process_s']:.1f} s a process; x{H100_SLOWER} for an H100")
    steps = 32 * 1024 * (1 + 5 * 2) / got["tokens_per_s"]  # the warm-up step and 2 repeats of 5
    torch_s = got["process_s"] + got["torch_compile_warmup_s"] + steps
    return {v: H100_SLOWER * (got["process_s"] + got["compile_s"] * COMPILE_FACTOR.get(v, 1) + steps
                              + (torch_s if v == "plain" else 0)) for v in names}, source


def process_seconds(step: dict[str, Any]) -> float | None:
    """A step part's time not spent compiling or stepping, per child process: imports,
    device start, initialisation."""
    records = step.get("records") or []
    if not records or not step.get("seconds"):
        return None
    work, processes = 0.0, 0
    for r in records:
        tokens = r["batch"] * r["seq"] * (1 + r["steps"] * r["repeats"])
        work += (r.get("compile_s") or 0) + (tokens / r["tokens_per_s"] if r.get("tokens_per_s") else 0)
        processes += 1
        for prefix in ("torch_", "torch_compile_"):
            if r.get(prefix + "tokens_per_s"):
                work += (r.get(prefix + "warmup_s") or 0) + tokens / r[prefix + "tokens_per_s"]
                processes += 1
    return max(0.0, step["seconds"] - work) / processes


def run(check: Any, budget: Any, base: dict[str, Any], layers: int, measure: Callable, fail: type) -> dict:
    """Time the chosen variants (``--variants``), then the combination, each within a share
    of ``budget`` in proportion to its estimate; the records go into the check's results as
    they come. The dry run times the candidates in one process (a CPU ignores the GPU
    flags) and the combination in another."""
    part = check.results.part("variants")
    chosen = pick(check.scale.variants)
    cases = [variant_case(base, name, opts, layers) for name, opts in VARIANTS if name in chosen]
    groups = [cases] if check.scale.dry else [[c] for c in cases]
    each = seconds_each(check.scale.dry, names=chosen)[0]
    for i, group in enumerate(groups):
        this = sum(each[c["variant"]] for c in group)
        rest = sum(each[c["variant"]] for g in groups[i + 1:] for c in g) + each[COMBINED]
        part["records"].extend(measure(group, budget.share(this, rest), check.env()))
        check.results.write()
    combined = combined_options(part["records"])
    part["records"].extend(measure([dict(base, **combined, variant=COMBINED, options=combined, torch=False,
                                         torch_compile=False)], budget.left(), check.env()))
    part["figures"] = figures(part["records"])
    check.results.write()
    failed = [r for r in part["records"] if "error" in r]
    if failed:
        raise fail(f"{len(failed)} of {len(part['records'])} variants failed; first ({failed[0]['variant']}): "
                   f"{failed[0]['error']}")
    return part["figures"]


def figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Each variant against the plain step (speed and final loss) and torch.compile; the best."""
    plain = next((r for r in records if r["variant"] == "plain"), {})
    torch_rate = plain.get("torch_compile_tokens_per_s")
    out = {"torch_compile_tokens_per_s": torch_rate, "torch_compile_mfu": plain.get("torch_compile_mfu"),
           "torch_compile_warmup_s": plain.get("torch_compile_warmup_s"),
           "torch_compile_peak_gib": plain.get("torch_compile_peak_gib"), "vs_plain": {}, "vs_torch_compile": {},
           "loss_gap": {}}
    for r in records:
        if r.get("tokens_per_s") and plain.get("tokens_per_s"):
            out["vs_plain"][r["variant"]] = r["tokens_per_s"] / plain["tokens_per_s"]
            out["loss_gap"][r["variant"]] = abs(r["loss"] - plain["loss"])
        if r.get("tokens_per_s") and torch_rate:
            out["vs_torch_compile"][r["variant"]] = r["tokens_per_s"] / torch_rate
    timed = [r for r in records if r.get("tokens_per_s")]
    out["best"] = max(timed, key=lambda r: r["tokens_per_s"])["variant"] if timed else None
    return out


# --------------------------------------------------------------------------- markdown
def _num(v: Any, fmt: str, suffix: str = "") -> str:
    return "–" if v is None else format(v, fmt) + suffix


def table(part: dict[str, Any]) -> list[str]:
    """The variants table: one row a variant, torch.compile last (the README renders it too)."""
    fig = part.get("figures") or {}
    rows = []
    for r in part["records"]:
        opts = ", ".join(f"{k}={v}" for k, v in (r.get("options") or {}).items()) or "–"
        rate = (f"{r['tokens_per_s']:,.0f}" + (f" ({100 * r['mfu']:.1f}%)" if r.get("mfu") is not None else "")
                if r.get("tokens_per_s") else f"error: {str(r.get('error'))[:70]}".replace("|", "/"))
        rows.append((r["variant"], opts, rate, _num(fig.get("vs_plain", {}).get(r["variant"]), ".2f", "×"),
                     _num(fig.get("vs_torch_compile", {}).get(r["variant"]), ".2f", "×"), _num(r.get("compile_s"), ".1f"),
                     _num(r.get("compiled_peak_gib"), ".2f"), _num(fig.get("loss_gap", {}).get(r["variant"]), ".1e")))
    if fig.get("torch_compile_tokens_per_s"):
        mfu = fig.get("torch_compile_mfu")
        rows.append(("torch.compile", "–", f"{fig['torch_compile_tokens_per_s']:,.0f}"
                     + (f" ({100 * mfu:.1f}%)" if mfu is not None else ""), "–", "1.00×",
                     _num(fig.get("torch_compile_warmup_s"), ".1f"), _num(fig.get("torch_compile_peak_gib"), ".2f"),
                     "–"))
    return markdown_table(("variant", "options", "tokens/s (MFU)", "vs plain", "vs torch.compile", "compile s",
                           "compiled peak GiB", "loss gap"), rows)


def markdown(part: dict[str, Any]) -> list[str]:
    """The variants section of results.md: what was timed, the table, what did not run."""
    fig = part.get("figures") or {}
    skipped = next((r["torch_skipped"] for r in part["records"] if r.get("torch_skipped")), None)
    first = part["records"][0] if part["records"] else {}
    lines = ["## Execution variants", "",
             f"{first.get('label', 'paper M5')} at {first.get('batch')} × {first.get('seq')}, {first.get('dtype')}, no "
             "teachers; each variant in a process of its own. Compile s: torch.compile's is its warm-up. Loss gap: "
             "|final loss − the plain step's| after the same steps from the same state. Best: "
             f"{fig.get('best') or '–'}.", ""]
    lines += table(part)
    return lines + (["", f"torch.compile: not run ({skipped})."] if skipped else [])
