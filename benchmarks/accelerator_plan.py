"""The accelerator check's plan: what it runs and at which scale, and what each part is
estimated to cost, from which the budget is shared (``--list``, ``--cases``).

The real plan (``REAL``, for one accelerator) and the dry run (``DRY``, toy shapes on the
CPU) differ only here, in shapes and steps: the code that runs them is the same. The run
configs the training parts write come from here too, so that a test can check, without a
GPU, that every config the real plan writes loads at the paper's shapes.

Loaded from its file by accelerator_check.py after its neighbours (benchmarks is no package:
the imports below find the scripts it loaded first).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

import bench_step as bench
import variants
import yaml

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("data", "step", "variants", "growth", "engine", "gpt_paper", "gptl_vs_loire")


# --------------------------------------------------------------------------- the plan's scale
@dataclasses.dataclass(frozen=True)
class Row:
    """Cases of the step table: one shape at one batch x seq, for each teacher count, with
    the PyTorch modes timed beside each count (``torch``: count -> modes)."""

    label: str
    shape: str
    teachers: tuple[int, ...]
    batch: int
    seq: int
    torch: dict[int, tuple[str, ...]]
    memory: bool = False  # its compiled and device peaks make the "1.1B memory" table
    name: str = ""  # its cases' name prefix (``--cases``); default: the shape
    default: bool = True  # in the plan unless ``--cases`` chooses; False: run only when named


@dataclasses.dataclass(frozen=True)
class Scale:
    """Everything that differs between the real plan and the dry run: shapes and steps.
    The code that runs them is the same."""

    dry: bool
    dtype: str
    steps: int
    repeats: int
    rows: tuple[Row, ...]
    torch_backend: str
    grow_args: tuple[str, ...]
    engine_steps: int
    paper_steps: int  # steps a stage of gpt_paper.yaml
    suite_steps: int  # steps a stage of GPT_L vs LOIRE
    suite_batch: int
    compile_passes: tuple[str, ...]  # bench_compile.py's passes: cache off, into an empty cache, warm
    stages: int | None  # None: every stage of gpt_paper.yaml
    eval_batches: int
    toy_model: dict[str, int] | None  # replaces gpt_paper.yaml's model (and scales its growth)
    only: str | None = None  # --cases: the step cases kept (None: all)
    variants: str | None = None  # --variants: the execution variants timed (None: all)


# The step table is today's defaults beside torch.compile at the three cases the README
# quotes; the other rows run when --cases names them (the KD costs at 4 teachers, 64 x 1024).
REAL = Scale(
    dry=False, dtype="bfloat16", steps=5, repeats=2, torch_backend="inductor",
    rows=(Row("paper M5", "m5", (0, 1), 32, 1024, {0: ("compile",), 1: ("compile",)}),
          Row("1.1B final stage", "1b", (0,), 8, 1024, {0: ("compile",)}, memory=True),
          Row("paper M5", "m5", (4,), 32, 1024, {}, default=False),
          Row("1.1B final stage", "1b", (1, 4), 8, 1024, {}, memory=True, default=False),
          Row("paper M5", "m5", (4,), 64, 1024, {}, default=False)),
    grow_args=("--mesh", "1"),
    engine_steps=30, paper_steps=16, suite_steps=60, suite_batch=32, compile_passes=("off", "cold", "warm"), stages=None,
    eval_batches=2, toy_model=None)

TOY = dict(vocab_size=320, max_seq_len=16, hidden=16, ffn=32, heads=2, head_dim=8, layers=1)
DRY = Scale(
    dry=True, dtype="float32", steps=2, repeats=1, torch_backend="aot_eager",  # inductor's C++ build: ~17 s on a CPU
    rows=(Row("toy (as M5)", "toy", (0, 1), 4, 16, {0: ("eager", "compile"), 1: ("compile",)}),
          # at the M5 row's batch: its program comes from the dry run's cache
          Row("toy (as 1.1B)", "toy", (0,), 4, 16, {0: ("compile",)}, memory=True, name="toy1b"),
          Row("toy (as M5)", "toy", (4,), 8, 16, {}, default=False)),
    grow_args=("--mesh", "1", "--batch", "2", "--seq", "8", "vocab_size=64", "max_seq_len=16", "hidden=16", "ffn=32",
               "heads=2", "head_dim=8", "layers=1"),
    # the suite as gpt_paper's run (batch, steps): LOIRE's programs are then those already in the cache
    # cold and warm only: "off" runs the same code as "cold" with another flag, and a third pass would take the dry run
    # past its minute
    engine_steps=6, paper_steps=6, suite_steps=6, suite_batch=64, compile_passes=("cold", "warm"), stages=2,
    eval_batches=1, toy_model=TOY)

# Estimated seconds of each part on one H100 (the dry run's on two CPU cores): the budget is
# shared in these proportions. The step and variants parts' own estimates come from their cases.
PART_SECONDS = {False: {"data": 1, "growth": 45, "engine": 100, "gpt_paper": 220, "gptl_vs_loire": 220},
                True: {"data": 5, "growth": 4, "engine": 6, "gpt_paper": 10, "gptl_vs_loire": 15}}
RECORDED = ROOT / "benchmarks" / "results" / "accelerator" / "followup-h100.jsonl"  # the H100 rounds the estimate reads
# Per teacher, a step's compilation and torch.compile's warm-up grow by about these (the H200 check of 2026-11-26:
# M5 compiled in 11.7 s without a teacher, 12.1 s with one, 18.8 s with four; torch.compile warmed up in 26.2 s, 27.5 s)
TEACHER_COMPILE, TEACHER_WARMUP = 0.15, 0.05
FALLBACK = {"m5": {"compile_s": 45.0, "tokens_per_s": 480_000.0, "torch_warmup_s": 31.0},
            "1b": {"compile_s": 65.0, "tokens_per_s": 63_000.0, "torch_warmup_s": 42.0},
            "process": {"jax": 8.0, "torch": 22.0}}


def recorded_figures(path: Path = RECORDED) -> tuple[dict[str, dict[str, float]], str]:
    """(figures, where from): per shape the unrolled step's compile seconds and tokens/s and
    torch.compile's warm-up, and a JAX and a torch.compile child's start (what a record's
    seconds hold beyond compiling and stepping), from the H100 follow-up's records."""
    if not path.is_file():
        return FALLBACK, "assumed figures (no recorded H100 follow-up)"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    timed = [r for r in rows if r.get("tokens_per_s") and r.get("compile_s") and r.get("seconds")]

    def steps(r: dict, rate: float) -> float:
        return r["batch"] * 1024 * 11 / rate  # the follow-up's: a warm-up step and 2 repeats of 5, at 1024 tokens

    out: dict[str, dict[str, float]] = {}
    for shape in ("m5", "1b"):
        unrolled = [r for r in timed if r["shape"] == shape and r.get("scan_unroll_run", 1) > 1]
        warmups = [r["torch_compile_warmup_s"] for r in timed if r["shape"] == shape and r.get("torch_compile_warmup_s")]
        out[shape] = {"compile_s": statistics.median(r["compile_s"] for r in unrolled),
                      "tokens_per_s": statistics.median(r["tokens_per_s"] for r in unrolled),
                      "torch_warmup_s": max(warmups)}
    jax_s = statistics.median(r["seconds"] - r["compile_s"] - steps(r, r["tokens_per_s"]) for r in timed
                              if not r.get("torch_compile_tokens_per_s"))
    torch_s = max(r["seconds"] - r["compile_s"] - steps(r, r["tokens_per_s"]) - jax_s - r["torch_compile_warmup_s"]
                  - steps(r, r["torch_compile_tokens_per_s"]) for r in timed if r.get("torch_compile_tokens_per_s"))
    out["process"] = {"jax": jax_s, "torch": torch_s}
    return out, (f"the H100 follow-up of 2026-11-27, {path.name}: unrolled compile M5 {out['m5']['compile_s']:.1f} s, "
                 f"1.1B {out['1b']['compile_s']:.1f} s; torch.compile warm-up {out['m5']['torch_warmup_s']:.1f} s, "
                 f"{out['1b']['torch_warmup_s']:.1f} s; a JAX child starts in {jax_s:.1f} s, a torch one in "
                 f"{torch_s:.1f} s")


def case_seconds(case: dict, dry: bool, figures: dict | None = None) -> float:
    """Estimated seconds of one step case, its PyTorch runs included (the children's starts
    are the part's: ``step_seconds``)."""
    if dry:
        return 2 + 5 * len(bench.torch_modes(case))
    shape = (figures or recorded_figures()[0])[case["shape"]]
    tokens = case["batch"] * case["seq"] * (1 + case["steps"] * case["repeats"])
    jax_s = shape["compile_s"] * (1 + TEACHER_COMPILE * case["teachers"]) + tokens / shape["tokens_per_s"]
    torch_s = sum(shape["torch_warmup_s"] * (1 + TEACHER_WARMUP * case["teachers"]) + tokens / shape["tokens_per_s"]
                  for _ in bench.torch_modes(case))
    return jax_s + torch_s


def step_seconds(cases: list[dict], dry: bool) -> float:
    """The step part: its cases, all in one JAX child, then one PyTorch child."""
    if dry:
        return sum(case_seconds(c, True) for c in cases)
    figures = recorded_figures()[0]
    torch = any(bench.torch_modes(c) for c in cases)
    return (figures["process"]["jax"] + figures["process"]["torch"] * torch
            + sum(case_seconds(c, False, figures) for c in cases))


def step_cases(scale: Scale, chosen: bool = True) -> list[dict]:
    """The cases of the step table, as bench_step.py checks and builds them: the default rows'
    (``chosen``), or those ``--cases`` names from every row; every row's with ``chosen=False``."""
    out = []
    for row in scale.rows:
        argv = ["--shapes", row.shape, "--teachers", ",".join(map(str, row.teachers)), "--dtypes", scale.dtype,
                "--batch", str(row.batch), "--seq", str(row.seq), "--steps", str(scale.steps),
                "--repeats", str(scale.repeats), "--mesh", "1", "--torch-backend", scale.torch_backend]
        for case in bench.cases_of(argv):
            modes = row.torch.get(case["teachers"], ())
            case.update(label=row.label, memory_row=row.memory, torch="eager" in modes,
                        torch_compile="compile" in modes, name=variants.case_name(case, row.name), default=row.default)
            out.append(case)
    if not chosen:
        return out
    return [c for c in out if c["default"]] if scale.only is None else variants.select(out, scale.only)


def variants_figures(scale: Scale) -> dict[str, float]:
    """What a variant of the M5 case costs (``variants.seconds_each``): its compilation, its
    steps, torch.compile's child beside the defaults, a JAX child's start."""
    if scale.dry:
        return {}
    figures = recorded_figures()[0]
    m5, tokens = figures["m5"], 32 * 1024 * (1 + scale.steps * scale.repeats)
    return {"compile_s": m5["compile_s"], "step_s": tokens / m5["tokens_per_s"], "process_s": figures["process"]["jax"],
            "torch_s": figures["process"]["torch"] + m5["torch_warmup_s"] + tokens / m5["tokens_per_s"]}


def reuses_defaults(scale: Scale, parts: list[str] | tuple[str, ...]) -> bool:
    """Whether the variants part takes its defaults' row from the step part's M5 case without
    teachers (the step part runs it before)."""
    base = next(c for c in step_cases(scale, chosen=False) if c["teachers"] == 0)
    return "step" in parts and any(c["name"] == base["name"] for c in step_cases(scale))


def part_seconds(name: str, scale: Scale, parts: list[str] | tuple[str, ...] = ()) -> float:
    """A part's estimated seconds; the variants part's depends on whether the step part runs
    before it (``parts``), whose case of the defaults it then reuses."""
    if name == "step":
        return step_seconds(step_cases(scale), scale.dry)
    if name == "variants":
        each = variants.seconds_each(scale.dry, variants_figures(scale), variants.pick(scale.variants),
                                     reuses_defaults(scale, parts))
        return sum(each.values())
    return PART_SECONDS[scale.dry][name]


# --------------------------------------------------------------------------- the training runs' configs
def paper_config(scale: Scale, data: str, steps: int, batch: int | None = None) -> dict[str, Any]:
    """configs/gpt_paper.yaml for a short run: ``steps`` a stage with the paper's phase
    proportions (distillation a quarter, warmup and gate ramp half), brief evaluation, only
    stage-end checkpoints; on ``data``, the model's vocabulary kept. The dry run shrinks
    the model (scaling every growth with it) and keeps the first stages."""
    cfg = yaml.safe_load((ROOT / "configs" / "gpt_paper.yaml").read_text())
    cfg["data"] = data
    kd = max(2, steps // 4)
    cfg["stage_defaults"].update(steps=steps, beta_steps=kd, warmup_steps=max(kd, steps // 2),
                                 gate_ramp_steps=max(kd, steps // 2))
    cfg["optimizer"]["warmup_steps"] = max(1, steps // 4)
    cfg["eval"] = {"every": 0, "batches": scale.eval_batches}
    cfg["checkpoint"] = {"save_every": 0, "keep": 1}
    if batch:
        cfg["batch_size"] = batch
    if scale.toy_model:
        shrink(cfg, scale.toy_model, scale.stages, ["SCI", "NEWS", "REV"])
    if scale.dry:
        cfg["precision"] = "float32"
    return cfg


def shrink(cfg: dict[str, Any], model: dict[str, int], stages: int | None, domains: list[str]) -> None:
    """Put ``model`` in the config's place and scale each growth by the factor it has there
    (hidden 384 -> 768 becomes 16 -> 32), keeping ``stages`` stages on ``domains``."""
    dims = ("hidden", "ffn", "heads", "layers")
    real = {k: cfg["model"][k] for k in dims}
    toy = {k: model[k] for k in dims}
    cfg["model"].update(model)
    cfg["seq_len"] = model["max_seq_len"]
    cfg["stages"] = cfg["stages"][:stages]
    for i, stage in enumerate(cfg["stages"]):
        stage["domains"] = [domains[i % len(domains)]]
        for g in stage.get("growth", []):
            size = toy[g["op"]] * g["size"] // real[g["op"]]
            real[g["op"]], toy[g["op"]], g["size"] = g["size"], size, size


def stage_shapes(cfg: dict[str, Any]) -> list[list[int]]:
    """(hidden, ffn, heads, layers) of every stage of a config mapping."""
    shape = {k: cfg["model"][k] for k in ("hidden", "ffn", "heads", "layers")}
    out = []
    for stage in cfg["stages"]:
        for g in stage.get("growth", []):
            shape[g["op"]] = g["size"]
        out.append([shape[k] for k in ("hidden", "ffn", "heads", "layers")])
    return out



def engine_config(scale: Scale, data: str) -> tuple[dict[str, Any], dict]:
    """(run config, benchmark case): one stage, no teachers, at the step table's first case."""
    case = next(c for c in step_cases(scale, chosen=False) if c["teachers"] == 0)
    student, _ = bench._configs(case)
    cfg = {"name": "engine-vs-bench",
           "model": {"preset": "paper", "vocab_size": student.vocab_size, "max_seq_len": case["seq"],
                     "hidden": student.hidden, "ffn": student.ffn, "heads": student.heads,
                     "head_dim": student.head_dim, "layers": student.layers},
           "data": data, "batch_size": case["batch"], "seq_len": case["seq"],
           "precision": "bf16" if case["dtype"] == "bfloat16" else "float32", "seed": 0, "mesh": "1",
           "optimizer": {"name": "adam", "lr": 1.0e-4, "schedule": "constant", "warmup_steps": 0, "clip_norm": 1.0},
           "checkpoint": {"save_every": 0, "keep": 1}, "eval": {"every": 0, "batches": 1},
           "stages": [{"name": "M5", "domains": [first_domain(data)], "steps": scale.engine_steps}]}
    return cfg, case


def first_domain(data_config: str) -> str:
    return yaml.safe_load(Path(data_config).read_text())["domains"][0]["name"]



def suite_config(scale: Scale, data: str) -> dict[str, Any]:
    """The LOIRE config GPT_L and LOIRE derive from: gpt_paper.yaml at the suite's batch."""
    base = paper_config(scale, data, scale.suite_steps, batch=scale.suite_batch)
    base["name"] = "accelerator-check"
    return base


# --------------------------------------------------------------------------- --list
def plan_lines(scale: Scale, budget_min: float, parts: list[str]) -> list[str]:
    """What the plan runs and each part's allowance if every part before it took its estimate."""
    est = {p: part_seconds(p, scale, parts) for p in parts}
    total = sum(est.values())
    data = str(ROOT / "configs" / "domains" / "default.yaml")
    out = [f"plan ({'dry run' if scale.dry else 'accelerator'}), budget {budget_min:g} min; estimate "
           f"{total / 60:.1f} min" + ("" if scale.dry else f" ({recorded_figures()[1]})") + ":"]
    for name in parts:
        out.append(f"  {name}: estimate {est[name]:.0f} s, allowance about {60 * budget_min * est[name] / total:.0f} s")
        if name == "step":
            for c in step_cases(scale):
                student, _ = bench._configs(c)
                modes = "+".join(bench.torch_modes(c)) or "-"
                out.append(f"    {c['name']}: {c['label']} ({student.hidden}, {student.ffn}, {student.heads}, {student.layers}) "
                           f"V{student.vocab_size} {c['batch']}x{c['seq']} {c['dtype']} teachers {c['teachers']}; "
                           f"torch {modes}; {scale.steps} steps x {scale.repeats}")
        elif name == "variants":
            reuse = reuses_defaults(scale, parts)
            out.append(f"    M5 32 x 1024, no teachers: {', '.join(variants.pick(scale.variants))}, {variants.COMBINED}; "
                       + ("the defaults and their torch.compile: the step part's case" if reuse else
                          "torch.compile beside the defaults") + f". Estimate {est[name] / 60:.1f} min")
        elif name == "growth":
            out.append("    launch/grow_demo.py " + " ".join(scale.grow_args))
        elif name == "engine":
            cfg, _ = engine_config(scale, data)
            m = cfg["model"]
            out.append(f"    one stage of ({m['hidden']}, {m['ffn']}, {m['heads']}, {m['layers']}) V{m['vocab_size']}, "
                       f"{cfg['batch_size']}x{cfg['seq_len']}, {scale.engine_steps} steps")
        elif name in ("gpt_paper", "gptl_vs_loire"):
            steps, batch = ((scale.paper_steps, None) if name == "gpt_paper" else (scale.suite_steps, scale.suite_batch))
            cfg = paper_config(scale, data, steps, batch)
            shapes = " -> ".join(f"({h}, {f}, {a}, {L})" for h, f, a, L in stage_shapes(cfg))
            what = "gpt_paper.yaml" if name == "gpt_paper" else "GPT_L and LOIRE from gpt_paper.yaml"
            out.append(f"    {what}: {shapes}, V{cfg['model']['vocab_size']}, {cfg['batch_size']}x{cfg['seq_len']}, "
                       f"{steps} steps a stage")
    return out
