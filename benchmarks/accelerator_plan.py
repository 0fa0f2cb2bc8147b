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


REAL = Scale(
    dry=False, dtype="bfloat16", steps=5, repeats=2, torch_backend="inductor",
    rows=(Row("paper M5", "m5", (0, 1, 4), 32, 1024, {0: ("eager", "compile"), 1: ("compile",)}),
          Row("1.1B final stage", "1b", (0, 1, 4), 8, 1024, {0: ("compile",)}, memory=True),
          Row("paper M5", "m5", (4,), 64, 1024, {})),
    grow_args=("--mesh", "1"),
    engine_steps=30, paper_steps=16, suite_steps=60, suite_batch=32, compile_passes=("off", "cold", "warm"), stages=None,
    eval_batches=2, toy_model=None)

TOY = dict(vocab_size=320, max_seq_len=16, hidden=16, ffn=32, heads=2, head_dim=8, layers=1)
DRY = Scale(
    dry=True, dtype="float32", steps=2, repeats=1, torch_backend="aot_eager",  # inductor's C++ build: ~17 s on a CPU
    rows=(Row("toy (as M5)", "toy", (0, 1, 4), 4, 16, {0: ("eager", "compile"), 1: ("compile",)}),
          # at the M5 row's batch: its program comes from the dry run's cache (1, 4 teachers: as M5's)
          Row("toy (as 1.1B)", "toy", (0,), 4, 16, {0: ("compile",)}, memory=True, name="toy1b"),
          Row("toy (as M5)", "toy", (4,), 8, 16, {})),
    grow_args=("--mesh", "1", "--batch", "2", "--seq", "8", "vocab_size=64", "max_seq_len=16", "hidden=16", "ffn=32",
               "heads=2", "head_dim=8", "layers=1"),
    # the suite as gpt_paper's run (batch, steps): LOIRE's programs are then those already in the cache
    # cold and warm only: "off" runs the same code as "cold" with another flag, and a third pass would take the dry run
    # past its minute
    engine_steps=6, paper_steps=6, suite_steps=6, suite_batch=64, compile_passes=("cold", "warm"), stages=2,
    eval_batches=1, toy_model=TOY)

# Estimated seconds of each part on one H100 (the dry run's on two CPU cores): the budget is
# shared in these proportions. The step part's own estimate is the sum of its cases'.
PART_SECONDS = {False: {"data": 1, "growth": 45, "engine": 100, "gpt_paper": 220, "gptl_vs_loire": 220},
                True: {"data": 5, "growth": 4, "engine": 6, "gpt_paper": 10, "gptl_vs_loire": 15}}


def case_seconds(case: dict, dry: bool) -> float:
    """Estimated seconds of one step case, its PyTorch runs included."""
    if dry:
        return 2 + 5 * len(bench.torch_modes(case))
    big = case["shape"] == "1b"
    jax_s = (70 if big else 45) + 15 * case["teachers"] * (case["batch"] * case["seq"]) / 32768
    torch_s = sum(40 if m == "eager" else (120 if big else 90) for m in bench.torch_modes(case))
    return jax_s + torch_s



def step_cases(scale: Scale, chosen: bool = True) -> list[dict]:
    """Every case of the step table, as bench_step.py checks and builds them; ``chosen``:
    those ``--cases`` keeps."""
    out = []
    for row in scale.rows:
        argv = ["--shapes", row.shape, "--teachers", ",".join(map(str, row.teachers)), "--dtypes", scale.dtype,
                "--batch", str(row.batch), "--seq", str(row.seq), "--steps", str(scale.steps),
                "--repeats", str(scale.repeats), "--mesh", "1", "--torch-backend", scale.torch_backend]
        for case in bench.cases_of(argv):
            modes = row.torch.get(case["teachers"], ())
            case.update(label=row.label, memory_row=row.memory, torch="eager" in modes,
                        torch_compile="compile" in modes, name=variants.case_name(case, row.name))
            out.append(case)
    return variants.select(out, scale.only) if chosen else out


def part_seconds(name: str, scale: Scale) -> float:
    if name == "step":
        return sum(case_seconds(c, scale.dry) for c in step_cases(scale))
    if name == "variants":
        return variants.estimate(scale.dry, names=variants.pick(scale.variants))[0]
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
    est = {p: part_seconds(p, scale) for p in parts}
    total = sum(est.values())
    data = str(ROOT / "configs" / "domains" / "default.yaml")
    out = [f"plan ({'dry run' if scale.dry else 'accelerator'}), budget {budget_min:g} min:"]
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
            out.append(f"    {', '.join(variants.pick(scale.variants))}, {variants.COMBINED}; torch.compile beside "
                       f"the plain one. Estimate {est[name] / 60:.1f} min ({variants.estimate(scale.dry)[1]})")
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
