"""The accelerator check's ``variants`` part (issues 41, 58), and what the check needs to
choose its step cases and name its device and commit.

Today's defaults against each candidate execution path (docs/performance.md), each an
execution option proven on the CPU to compute the default step up to rounding: the fused
Pallas kernels (``model.fused``), float32 loss logits (the default writes them in bf16 on
GPUs, as torch.compile's autocast reference does), loss blocks of 4,096 tokens, and remat
``dots`` (the policy the memory choice replaced); the rest by name (``--variants``). The
paper's M5 at 32 x 1024 bf16, no teachers: the defaults are the step part's case of that
shape when it ran (its torch.compile too), else timed here beside torch.compile; every
candidate runs in one process (a set of XLA flags in one of its own: XLA reads them when it
starts). Then the best combination: the options of every candidate at least ``WIN`` faster
than the defaults (the faster first where two set the same option), timed unless it is a
record already (one winner, or none: the defaults). Each variant's final loss is recorded
beside the defaults': the same initial state and batches, so on the GPU it shows a variant
that changed what the step computes beyond rounding.

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

PLAIN = "defaults"  # today's defaults: every auto as the trainer resolves it
# (name, options): the defaults, then one candidate each. The first ``DEFAULT_COUNT`` are timed
# unless ``--variants`` names others (``all``: every one); "layers" is the student's depth.
VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    (PLAIN, {}),
    ("fused kernels", {"fused": "all"}),
    ("float32 logits", {"loss_logits": "float32"}),
    ("loss blocks 4096", {"loss_chunk": "4096"}),
    ("remat dots", {"remat": "dots"}),
    ("fused norm", {"fused": "norm"}),
    ("fused gelu", {"fused": "gelu"}),
    ("two-pass softmax", {"loss_softmax": "two_pass"}),
    ("remat dots_names", {"remat": "dots_names"}),
    ("remat full", {"remat": "full"}),
    ("scanned", {"scan_unroll": 1}),
    ("weights cast once", {"weight_cast": "step"}),
    ("xla cudnn_norm", {"xla_gpu_flags": "cudnn_norm"}),
    ("xla triton_fusion", {"xla_gpu_flags": "triton_fusion"}),
    ("xla scheduler", {"xla_gpu_flags": "scheduler"}),
)
DEFAULT_COUNT = 5  # the defaults and four candidates: with the step part, nine minutes of an H100
COMBINED = "best combination"
OPTION_KEYS = ("scan_unroll", "weight_cast", "remat", "xla_gpu_flags", "fused", "loss_logits", "loss_chunk",
               "loss_softmax")
WIN = 1.01  # a variant "wins" when it is at least 1% faster than the defaults
DRY_SECONDS = 4.0  # a toy variant on two CPU cores
FUSED_LAST = ("fused",)  # candidates run last in their process: a kernel the GPU cannot build costs no other


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
    """``base`` (the defaults' M5 case) under ``options``; torch.compile beside the defaults only."""
    opts = {k: (layers if v == "layers" else v) for k, v in options.items()}
    return dict(base, **opts, variant=name, options=opts, torch=False,
                torch_compile=name == PLAIN and base["torch_compile"])


def combined_options(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The best combination: the options of every candidate at least ``WIN`` faster than the
    defaults, the faster first where two set the same option; none faster: the defaults' own
    (no option)."""
    plain = next((r.get("tokens_per_s") for r in records if r["variant"] == PLAIN), None)
    timed = sorted((r for r in records if r["variant"] not in (PLAIN, COMBINED) and r.get("tokens_per_s")),
                   key=lambda r: -r["tokens_per_s"])
    out: dict[str, Any] = {}
    for r in (r for r in timed if plain and r["tokens_per_s"] >= WIN * plain):
        for k, v in r["options"].items():
            out.setdefault(k, v)
    return out


def pick(text: str | None) -> tuple[str, ...]:
    """The variants ``--variants`` names (comma-separated, as the table names them; ``all``:
    every one), the defaults first whether named or not: every other row is measured against
    them. None: the default selection (the first ``DEFAULT_COUNT``). ValueError (one line)
    names the known."""
    known = [v for v, _ in VARIANTS]
    if text is None or text.strip() == "all":
        return tuple(known[:DEFAULT_COUNT] if text is None else known)
    names = named(text, known, "--variants", hint=" (or all)")
    return tuple(v for v in known if v == PLAIN or v in names)


def seconds_each(dry: bool, figures: dict[str, float], names: tuple[str, ...] | None = None,
                 reuse_defaults: bool = False) -> dict[str, float]:
    """Each variant's estimated seconds (the combination's last), ``figures`` the plan's for the
    M5 case (compile_s, step_s, torch_s: a torch.compile child's, process_s: a JAX child's
    start): a candidate costs its compilation and steps; each child process its start, charged
    to its first variant; the defaults, unless the step part's record is reused, their own
    compilation and torch.compile's child. The part shares its allowance in these proportions."""
    names = names or pick(None)
    if dry:
        return {v: DRY_SECONDS * (2 if v == PLAIN and not reuse_defaults else 1) for v in (*names, COMBINED)}
    one = figures["compile_s"] + figures["step_s"]
    out = {}
    started: set[str] = set()
    for v in names:
        if v == PLAIN and reuse_defaults:
            out[v] = 0.0
            continue
        flags = dict(VARIANTS)[v].get("xla_gpu_flags", "none")
        out[v] = one + (figures["torch_s"] if v == PLAIN else 0.0) + (0.0 if flags in started else figures["process_s"])
        started.add(flags)
    out[COMBINED] = one
    return out


def run(check: Any, budget: Any, base: dict[str, Any], layers: int, measure: Callable, fail: type,
        figures_m5: dict[str, float], reused: dict[str, Any] | None) -> dict:
    """Time the chosen variants (``--variants``), then the best combination, within ``budget``,
    each process's share in proportion to its estimate; the records go into the check's results
    as they come. ``reused``: the step part's record of the defaults' case, taken as the
    defaults' row (with its torch.compile) instead of timing them again."""
    part = check.results.part("variants")
    chosen = pick(check.scale.variants)
    each = seconds_each(check.scale.dry, figures_m5, chosen, reused is not None)
    cases = [variant_case(base, name, opts, layers) for name, opts in VARIANTS if name in chosen]
    if reused is not None:
        part["records"].append(dict(reused, variant=PLAIN, options={}, reused="the step part's case"))
        cases = cases[1:]
    cases.sort(key=lambda c: any(k in c["options"] for k in FUSED_LAST))  # stable: the table's order otherwise
    groups = [cases] if check.scale.dry else _by_flags(cases)
    for i, group in enumerate(groups):
        this = sum(each[c["variant"]] for c in group)
        rest = sum(each[c["variant"]] for g in groups[i + 1:] for c in g) + each[COMBINED]
        part["records"].extend(measure(group, budget.share(this, rest), check.env()))
        check.results.write()
    order = {name: i for i, (name, _) in enumerate(VARIANTS)}
    part["records"].sort(key=lambda r: order.get(r["variant"], len(order)))
    combined = combined_options(part["records"])
    same = next((r for r in part["records"] if r.get("tokens_per_s") and r["options"] == combined), None)
    if same is not None:  # one winner, or none (the defaults): that record is the combination's
        part["records"].append(dict(same, variant=COMBINED, options=combined, same_as=same["variant"]))
    else:
        part["records"].extend(measure([dict(base, **combined, variant=COMBINED, options=combined, torch=False,
                                             torch_compile=False)], budget.left(), check.env()))
    part["figures"] = figures(part["records"])
    check.results.write()
    failed = [r for r in part["records"] if "error" in r]
    if failed:
        raise fail(f"{len(failed)} of {len(part['records'])} variants failed; first ({failed[0]['variant']}): "
                   f"{failed[0]['error']}")
    return part["figures"]


def _by_flags(cases: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """One child process for the variants without XLA flags, one for each flag set."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in cases:
        groups.setdefault(c.get("xla_gpu_flags", "none"), []).append(c)
    return list(groups.values())


def figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Each variant against the defaults (speed and final loss) and torch.compile; the best."""
    plain = next((r for r in records if r["variant"] == PLAIN), {})
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
    timed = [r for r in records if r.get("tokens_per_s") and r["variant"] != COMBINED]
    out["best"] = max(timed, key=lambda r: r["tokens_per_s"])["variant"] if timed else None
    out["combined_options"] = next((r["options"] for r in records if r["variant"] == COMBINED), None)
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
    return markdown_table(("variant", "options", "tokens/s (MFU)", "vs defaults", "vs torch.compile", "compile s",
                           "compiled peak GiB", "loss gap"), rows)


def markdown(part: dict[str, Any]) -> list[str]:
    """The variants section of results.md: what was timed, the table, what did not run."""
    fig = part.get("figures") or {}
    skipped = next((r["torch_skipped"] for r in part["records"] if r.get("torch_skipped")), None)
    first = part["records"][0] if part["records"] else {}
    same = next((r.get("same_as") for r in part["records"] if r["variant"] == COMBINED and r.get("same_as")), None)
    reused = any(r.get("reused") for r in part["records"])
    lines = ["## Execution variants", "",
             f"{first.get('label', 'paper M5')} at {first.get('batch')} × {first.get('seq')}, {first.get('dtype')}, no "
             "teachers: today's defaults" + (" (the step part's case)" if reused else "") + " against each candidate "
             "and the best combination (the options of every candidate at least 1% faster"
             + (f"; it is the {same} row's" if same else "") + "). Compile s: torch.compile's is its warm-up. Loss gap: "
             "|final loss − the defaults'| after the same steps from the same state. Fastest: "
             f"{fig.get('best') or '–'}.", ""]
    lines += table(part)
    return lines + (["", f"torch.compile: not run ({skipped})."] if skipped else [])
