"""On an accelerator, the figures README's Performance section quotes for the CPU, and more, in
one command, inside a time budget, offline.

    python benchmarks/accelerator_check.py --out DIR [--budget-min 25] [--parts step,growth,...]
    python benchmarks/accelerator_check.py --out DIR --dry-run     # the same plan at toy shapes, on CPU
    python benchmarks/accelerator_check.py --out DIR --list        # what it would run, and each part's time
    python benchmarks/accelerator_check.py --out DIR --parts step --cases m5-32x1024-t0,1b-8x1024-t0  # a short slot

The plan, one part after another, each in child processes of this one:

- ``data``: which prepared corpora are here (nothing is ever fetched: a missing one makes
  the parts that need it say so, with the command that prepares it).
- ``step``: the train-step table (``bench_step.py``'s exact step): paper M5 at 32 x 1024 with
  0, 1 and 4 teachers, at 64 x 1024 with 4; the 1.1B final stage at 8 x 1024 with 0, 1, 4
  (its memory); beside them, when torch is importable, the same-shape PyTorch eager and
  torch.compile steps (``torch_reference.py``). From it: the KD cost ratios. ``--cases``
  keeps the named cases only (``--list`` names them).
- ``variants``: M5 at 32 x 1024 under each candidate execution path and their best-looking
  combination, beside torch.compile (``variants.py``).
- ``growth``: the growth demo (``launch/grow_demo.py``), max |dlogits| after each operator.
- ``engine``: a one-stage ``launch/train.py`` run at M5's benchmark shape; its logged
  tokens/s against the benchmark's for the same shape.
- ``gpt_paper``: ``configs/gpt_paper.yaml`` (batch 64) for a few steps a stage on built-in
  data: tokens/s, MFU, compile time and compiled peak per stage and phase.
- ``gptl_vs_loire``: a short five-stage GPT_L vs LOIRE suite at the paper's shapes, run by
  ``bench_compile.py`` with the persistent cache off, into an empty cache and warm: wall time
  split (compile, growth, teachers, steps, evaluation), FLOPs, LOIRE's compile time against
  GPT_L's and a warm rerun's against a cold one.

Each part gets a share of the budget (``--budget-min``) in proportion to its estimated
cost; time a part leaves unused goes to the later ones, and a child that reaches its
allowance is killed with its process group. A part that fails or runs out of time is
recorded so, with its error's last line, and the plan goes on. ``DIR/results.json`` and
``DIR/results.md`` are rewritten after every part (and every step case), so a killed check
still leaves what it finished; each child's output is kept in ``DIR/run-*/logs``.

``--dry-run`` runs every part through the same code at toy shapes on the CPU, in about a
minute on two cores: it checks the plan, not the hardware. What it trims: two stages where
the real plan has five, a handful of steps, the test suite's fixture corpus, the toy 1.1B
row without teachers, its JAX cases in one process (and its PyTorch ones in another), and
one fresh compilation cache shared by its children, so that the programs its parts share
compile once; ``torch.compile`` uses the aot_eager backend there (inductor's C++ build
alone takes ~17 s on such a CPU). The real plan compiles cold: compile times are figures.
"""


import argparse
import dataclasses
import datetime
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import yaml

from loire_jax.analysis.tables import markdown_table
from loire_jax.errors import fail
from loire_jax.paths import write_atomic

ROOT = Path(__file__).resolve().parents[1]
MARKER = ".accelerator_check"  # in --out: this tool made the directory
PARTS = ("data", "step", "variants", "growth", "engine", "gpt_paper", "gptl_vs_loire")
FIXTURES = ROOT / "tests" / "data" / "fixtures"  # the test suite's offline corpus: the dry run's data
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PIP_NO_INDEX": "1"}


def _script(name: str):
    """A neighbour script (bench_step.py), loaded from its file: benchmarks is no package."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


bench = _script("bench_step")
compile_bench = _script("bench_compile")  # the GPT_L vs LOIRE part runs it; its labels and summary are reused
variants = _script("variants")  # the variants part, step cases by name, the device and commit of the header


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
PART_SECONDS[False]["variants"], PART_SECONDS[True]["variants"] = variants.estimate(False)[0], variants.estimate(True)[0]


def case_seconds(case: dict, dry: bool) -> float:
    """Estimated seconds of one step case, its PyTorch runs included."""
    if dry:
        return 2 + 5 * len(bench.torch_modes(case))
    big = case["shape"] == "1b"
    jax_s = (70 if big else 45) + 15 * case["teachers"] * (case["batch"] * case["seq"]) / 32768
    torch_s = sum(40 if m == "eager" else (120 if big else 90) for m in bench.torch_modes(case))
    return jax_s + torch_s


# --------------------------------------------------------------------------- time
class Budget:
    """A deadline, and fair shares of what is left before it."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def share(self, this: float, rest: float) -> float:
        """Seconds for a job estimated at ``this`` when jobs estimated at ``rest`` follow."""
        return self.left() * this / (this + rest) if this + rest > 0 else self.left()


class Interrupted(Exception):
    """SIGTERM: stop, as Ctrl-C does; the running child's group is killed on the way out."""


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
        self.head["updated"] = _now()
        self.head["seconds"] = round(time.monotonic() - self.start, 1)
        self.head["device"] = _device(self.parts) or self.head.get("probed")
        data = dict(self.head, parts=[self.parts[n] for n in PARTS if n in self.parts])
        write_atomic(self.out / "results.json", json.dumps(data, indent=1, default=str) + "\n")
        write_atomic(self.out / "results.md", markdown(data))


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _device(parts: dict[str, dict]) -> dict[str, Any] | None:
    """The accelerator the JAX cases ran on, as they reported it."""
    for r in parts.get("step", {}).get("records", []):
        if r.get("device_kind"):
            return {"devices": r.get("device"), "kind": r["device_kind"], "platform": r.get("platform"),
                    "peak_flops": r.get("peak_flops"), "peak_source": r.get("peak_source")}
    return None


def _versions() -> dict[str, str | None]:
    out = {}
    for name in ("jax", "jaxlib", "flax", "optax", "torch", "loire_jax"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


# --------------------------------------------------------------------------- one check
@dataclasses.dataclass
class Check:
    """One accelerator check: where it writes, its scale, its time, its child processes."""

    out: Path
    work: Path
    scale: Scale
    budget: Budget
    results: Results
    torch: bool
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    children: int = 0

    def env(self) -> dict[str, str]:
        """Children's environment: offline, this checkout's code; the dry run on the CPU."""
        env = {k: v for k, v in os.environ.items() if k not in ("JAX_ENABLE_X64", "JAX_COMPILATION_CACHE_DIR")}
        env.update(OFFLINE)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
        if self.scale.dry:
            env.update(JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
                       JAX_DISABLE_MOST_OPTIMIZATIONS="1", XLA_FLAGS="--xla_backend_optimization_level=0",
                       JAX_COMPILATION_CACHE_DIR=self.compile_cache(), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                       JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
        return env

    def compile_cache(self) -> str:
        """Where children keep compiled programs: nowhere in the real plan, whose compile
        times are figures (cold, every time); in the dry run a fresh cache of its own, so
        that the toy programs its parts share compile once."""
        return str(self.work / "xla-cache") if self.scale.dry else "off"

    def run(self, part: str, cmd: list[str], timeout: float, ok: tuple[int, ...] = (0,)) -> Any:
        """A child of ``part``, its output kept in the logs; raises PartError when it fails
        (an exit code not in ``ok``) or runs out of time, naming the error's last line."""
        if timeout < 1:
            raise PartError("out of time: no time left in its allowance")
        self.children += 1
        child = bench.run_child(cmd, timeout, self.env(), ROOT)
        log = self.work / "logs" / f"{self.children:02d}-{part}.log"
        log.write_text(f"$ {' '.join(cmd)}\n# exit {child.code}, {child.seconds:.1f} s\n\n--- stdout\n"
                       f"{child.stdout}\n--- stderr\n{child.stderr}")
        seen = re.search(r"^devices: (.*?)(;|$)", child.stdout, re.M)  # the CLIs' first line
        if seen:
            self.results.head.setdefault("devices_seen", seen.group(1))
        if child.timed_out:
            raise PartError(f"out of time: killed after {child.seconds:.0f} s (its allowance); log {log}")
        if child.code not in ok:
            raise PartError(f"{child.last_error_line()} (exit {child.code}; log {log})")
        return child


class PartError(Exception):
    """A part failed or ran out of time: the message is what the results say."""


class Skipped(Exception):
    """A part cannot run here (no prepared corpus): the message says why and what to do."""


# --------------------------------------------------------------------------- part: data
def data_part(check: Check, budget: Budget) -> dict[str, Any]:
    """Which corpora are prepared. The dry run prepares the fixture corpus in DIR."""
    if check.scale.dry:
        path = check.work / "data" / "fixture.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(fixture_stream(check.work / "data")))
        check.run("data", [sys.executable, "-m", "loire_jax.data", "prepare", "--config", str(path), "--quiet"],
                  budget.left())
        check.data = {"default": str(path), "gpt2": str(path),
                      "note": "the test suite's fixture corpus (three local domains, a 320-piece BPE)"}
        return {"prepared": {"fixture": {"config": str(path), "missing": None}}}
    found = {}
    for name in ("default", "default_gpt2"):
        path = ROOT / "configs" / "domains" / f"{name}.yaml"
        found[name] = {"config": str(path), "missing": prepared_problem(path)}
        if found[name]["missing"]:
            found[name]["prepare"] = prepare_command(name)
    check.data = {"default": None if found["default"]["missing"] else found["default"]["config"],
                  "gpt2": None if found["default_gpt2"]["missing"] else found["default_gpt2"]["config"]}
    return {"prepared": found}


def fixture_stream(data_dir: Path) -> dict[str, Any]:
    """The test suite's offline domains (tests/data/fixtures), prepared into ``data_dir``."""
    files = {"SCI": "science.txt", "NEWS": "news.jsonl", "REV": "reviews.txt"}
    missing = [f for f in files.values() if not (FIXTURES / f).is_file()]
    if missing:
        raise PartError(f"the dry run's corpus is missing from {FIXTURES}: {missing}")
    return {"data_dir": str(data_dir), "tokenizer": {"kind": "trained_bpe", "vocab_size": TOY["vocab_size"]},
            "validation_docs": 10, "split_seed": 0, "recovery_fraction": 0.1,
            "domains": [{"name": n, "source": {"kind": "local", "paths": [str(FIXTURES / f)]}}
                        for n, f in files.items()]}


def prepared_problem(path: Path) -> str | None:
    """Why the stream ``path`` is not prepared in its cache (None: it is), looking only:
    every domain's build and the tokenizer. The token cache is rebuilt offline if absent."""
    from loire_jax.config.loader import load_data_config
    from loire_jax.data import storage
    from loire_jax.data.prepare import domain_config_name, load_tokenizer

    try:
        cfg = load_data_config(path)
        for dom in cfg.domains:
            meta, why = storage.examine(cfg.root / "tfds", domain_config_name(cfg, dom))
            if meta is None:
                return f"domain {dom.name} is not prepared in {cfg.root} ({why})"
        load_tokenizer(cfg, build=False)
    except Exception as err:  # noqa: BLE001 - any reason is a reason not to run it
        return str(err).splitlines()[0] if str(err) else type(err).__name__
    return None


def prepare_command(name: str) -> str:
    return (f"python -m loire_jax.data prepare --config {name} (where the network is; then carry "
            "~/.cache/loire_jax here)")


# --------------------------------------------------------------------------- part: step
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


def step_part(check: Check, budget: Budget) -> dict[str, Any]:
    """The step table: each case's JAX process, then its PyTorch ones. The real plan times
    each case in a process of its own (its peak memory is its own); the dry run, all the
    JAX cases in one, as a check of the plan needs no per-case peak."""
    cases = step_cases(check.scale)
    if not check.torch:
        for case in cases:
            case.update(torch=False, torch_compile=False, torch_skipped="torch is not importable here")
    groups = [cases] if check.scale.dry else [[c] for c in cases]
    part = check.results.part("step")
    for i, group in enumerate(groups):
        this = sum(case_seconds(c, check.scale.dry) for c in group)
        rest = sum(case_seconds(c, check.scale.dry) for g in groups[i + 1:] for c in g)
        records = bench.measure(group, budget.share(this, rest), check.env())
        part["records"].extend(records)
        part["figures"] = step_figures(part["records"])
        check.results.write()
    failed = [r for r in part["records"] if "error" in r]
    if failed:
        raise PartError(f"{len(failed)} of {len(cases)} cases failed; first: {failed[0]['error']}")
    return part["figures"]


def step_figures(records: list[dict]) -> dict[str, Any]:
    """KD cost ratios (step time with k teachers over without, same shape and batch) and
    the 1.1B memory, from the step records."""
    kd = []
    for key in dict.fromkeys((r["label"], r["shape"], r["batch"], r["seq"]) for r in records):
        same = {r["teachers"]: r for r in records if (r["label"], r["shape"], r["batch"], r["seq"]) == key}
        base = same.get(0, {}).get("tokens_per_s")
        ratios = {str(k): base / r["tokens_per_s"] for k, r in same.items() if k and base and r.get("tokens_per_s")}
        if ratios:
            kd.append({"label": key[0], "shape": key[1], "batch": key[2], "seq": key[3], "ratio": ratios})
    memory = [{"teachers": r["teachers"], "compiled_peak_gib": r.get("compiled_peak_gib"),
               "device_peak_gib": r.get("device_peak_gib"), "torch_compile_peak_gib": r.get("torch_compile_peak_gib")}
              for r in records if r.get("memory_row")]
    return {"kd_cost": kd, "memory_1b": memory}


# --------------------------------------------------------------------------- part: growth
GROW_ROW = re.compile(r"^M(\d+)\s+(\S+)\s+\((\d+), (\d+), (\d+), (\d+)\)\s+([\d,]+)\s+([\d.e+-]+)", re.M)


def growth_part(check: Check, budget: Budget) -> dict[str, Any]:
    """The growth demo; exit 1 is its verdict "function not preserved", a figure to keep."""
    child = check.run("growth", [sys.executable, str(ROOT / "launch" / "grow_demo.py"), *check.scale.grow_args],
                      budget.left(), ok=(0, 1))
    rows = [{"model": f"M{m}", "operator": op, "shape": [int(h), int(f), int(a), int(L)],
             "params": int(p.replace(",", "")), "max_abs_dlogits": float(d)}
            for m, op, h, f, a, L, p, d in GROW_ROW.findall(child.stdout)]
    if len(rows) != 5:
        raise PartError(f"the growth demo printed {len(rows)} model rows, not 5 (log in {check.work / 'logs'})")
    part = check.results.part("growth")
    part["records"] = rows
    part["figures"] = {"max_abs_dlogits": max(r["max_abs_dlogits"] for r in rows),
                       "preserved": "function preserved at every step" in child.stdout}
    if not part["figures"]["preserved"]:
        raise PartError(f"function not preserved: max |dlogits| {part['figures']['max_abs_dlogits']:.2e}")
    return part["figures"]


# --------------------------------------------------------------------------- training runs
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


def paper_data(check: Check) -> tuple[str, str]:
    """(data config, note): the built-in stream with GPT-2's tokenizer if prepared, else the
    default one, whose smaller vocabulary fits in the model's: same shapes, same FLOPs."""
    if check.data.get("gpt2"):
        return check.data["gpt2"], check.data.get("note", "the built-in stream, GPT-2 tokenizer")
    if not check.data.get("default"):
        raise Skipped("no prepared built-in corpus here; prepare it: " + prepare_command("default"))
    return check.data["default"], ("the built-in stream with its 8192-piece BPE: the GPT-2 one is not prepared ("
                                   + prepare_command("default_gpt2") + "); the model keeps the 50,257-token head, "
                                   "so shapes and FLOPs are the paper's")


def train(check: Check, part: str, cfg: dict[str, Any], timeout: float) -> Path:
    """``launch/train.py`` on ``cfg`` (written beside its workdir); returns the workdir."""
    folder = check.work / part
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    workdir = folder / "run"
    check.run(part, [sys.executable, str(ROOT / "launch" / "train.py"), "--config", str(folder / "config.yaml"),
                     "--workdir", str(workdir), "--no-progress", "--compile-cache", check.compile_cache(),
                     "--mesh", "1"], timeout)
    return workdir


def phase_rates(workdir: Path) -> list[dict[str, Any]]:
    """Per stage and phase: median tokens/s and MFU over its steps after the first, its
    compile seconds and compiled peak, from the run's own records."""
    from loire_jax.analysis.records import read_records

    records, _ = read_records(workdir)
    steps: dict[tuple[int, str], list[dict]] = {}
    for r in records:
        if r.get("kind") == "train" and isinstance(r.get("tokens_per_s"), (int, float)):
            steps.setdefault((r["stage"], r["phase"]), []).append(r)
    compiled = {(r["stage"], r["phase"]): r for r in records if r.get("kind") == "compile"}
    out = []
    for (stage, phase), rows in steps.items():
        timed = rows[1:]
        comp = compiled.get((stage, phase), {})
        out.append({"stage": stage, "phase": phase, "steps": len(rows), "timed_steps": len(timed),
                    "tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed) if timed else None,
                    "mfu": statistics.median(r["mfu"] for r in timed) if timed and all(
                        isinstance(r.get("mfu"), (int, float)) for r in timed) else None,
                    "compile_s": comp.get("seconds"),
                    "compiled_peak_gib": comp["peak_bytes"] / 2**30 if comp.get("peak_bytes") else None})
    return out


# --------------------------------------------------------------------------- part: engine
def engine_part(check: Check, budget: Budget) -> dict[str, Any]:
    """A one-stage run at the step table's first shape (M5, 32 x 1024, no teachers), its
    logged tokens/s against the benchmark's for that shape: the step table's own case when
    it has one, else one measured here."""
    data = check.data.get("default") or check.data.get("gpt2")
    if not data:
        raise Skipped("no prepared built-in corpus here; prepare it: " + prepare_command("default"))
    cfg, case = engine_config(check.scale, data)
    student, _ = bench._configs(case)
    own = [r for r in check.results.part("step")["records"]
           if r.get("tokens_per_s") and all(r.get(k) == case[k] for k in ("shape", "batch", "seq", "dtype", "teachers"))]
    bench_s = 0 if own else case_seconds(dict(case, torch=False, torch_compile=False), check.scale.dry)
    workdir = train(check, "engine", cfg, budget.share(PART_SECONDS[check.scale.dry]["engine"], bench_s))
    stage, engine_rate = bench._engine_rate(str(workdir))
    if own:
        bench_rec, source = own[0], "the step table's case"
    else:
        bench_rec = bench.measure([dict(case, torch=False, torch_compile=False)], budget.left(), check.env())[0]
        source = "measured in this part"
    if not bench_rec.get("tokens_per_s"):
        raise PartError(f"the benchmark case failed: {bench_rec.get('error')}")
    return {"shape": [student.hidden, student.ffn, student.heads, student.layers], "vocab": student.vocab_size,
            "batch": case["batch"], "seq": case["seq"], "dtype": case["dtype"], "engine_tokens_per_s": engine_rate,
            "bench_tokens_per_s": bench_rec["tokens_per_s"], "ratio": engine_rate / bench_rec["tokens_per_s"],
            "bench_source": source, "engine_stage": stage, "engine_steps": check.scale.engine_steps}


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


# --------------------------------------------------------------------------- part: gpt_paper
def gpt_paper_part(check: Check, budget: Budget) -> dict[str, Any]:
    """configs/gpt_paper.yaml as shipped (batch 64, every stage, its KD warmup, replay and
    gate ramp), a few steps a stage."""
    data, note = paper_data(check)
    cfg = paper_config(check.scale, data, check.scale.paper_steps)
    workdir = train(check, "gpt_paper", cfg, budget.left())
    rows = phase_rates(workdir)
    shapes = stage_shapes(cfg)
    for r in rows:
        r["shape"] = shapes[r["stage"] - 1]
    check.results.part("gpt_paper")["records"] = rows
    return {"data": note, "batch": cfg["batch_size"], "seq": cfg["seq_len"], "steps_per_stage": check.scale.paper_steps,
            "stages": len(cfg["stages"]), "vocab": cfg["model"]["vocab_size"]}


# --------------------------------------------------------------------------- part: GPT_L vs LOIRE
def gptl_vs_loire_part(check: Check, budget: Budget) -> dict[str, Any]:
    """GPT_L and LOIRE derived from gpt_paper.yaml at 32 x 1024, through
    ``benchmarks/bench_compile.py``: where each one's wall time went and their training FLOPs
    (the first pass), and their compile time with the persistent cache off, into an empty
    cache and warm (a rerun), so LOIRE's compile time is measured against GPT_L's and the
    cache's saving against a cold compile."""
    data, note = paper_data(check)
    folder = check.work / "gptl_vs_loire"
    folder.mkdir(parents=True, exist_ok=True)
    base = suite_config(check.scale, data)
    (folder / "base.yaml").write_text(yaml.safe_dump(base, sort_keys=False))
    check.run("gptl_vs_loire", [sys.executable, str(ROOT / "benchmarks" / "bench_compile.py"), "--config",
                                str(folder / "base.yaml"), "--steps", "0", "--mesh", "1", "--passes",
                                ",".join(check.scale.compile_passes), "--workdir", str(folder / "runs"),
                                "--json", str(folder / "compile.json")]
              # the dry run's shared cache: its "cold" pass loads gpt_paper's toy programs (it checks the plan)
              + (["--cache-dir", check.compile_cache()] if check.scale.dry else []), budget.left())
    got = json.loads((folder / "compile.json").read_text())
    passes = got["results"]
    first = next(iter(passes.values()))
    records = [dict(first[name], system=name) for name in ("GPT_L", "LOIRE")]
    records += [{"system": name, "pass": key, "programs": r[name]["programs"], "compile_s": r[name]["compile_s"],
                 "lower_s": r[name]["lower_s"]} for key, r in passes.items() for name in ("GPT_L", "LOIRE")]
    check.results.part("gptl_vs_loire")["records"] = records
    g, lo = first["GPT_L"], first["LOIRE"]
    ratio = lambda a, b: a / b if b else None  # noqa: E731
    return {"data": note, "batch": base["batch_size"], "seq": base["seq_len"], "steps_per_stage": check.scale.suite_steps,
            "stages": len(base["stages"]), "first_pass": next(iter(passes)),
            "flops_ratio": got["ratios"]["flops_loire_over_gpt_l"],
            "steps_ratio": ratio(lo["breakdown"]["steps"], g["breakdown"]["steps"]),
            "wall_ratio": ratio(lo["breakdown"]["total"], g["breakdown"]["total"]),
            "compile": got["ratios"]}  # bench_compile.ratios: LOIRE / GPT_L per pass, warm / cold per system


def suite_config(scale: Scale, data: str) -> dict[str, Any]:
    """The LOIRE config GPT_L and LOIRE derive from: gpt_paper.yaml at the suite's batch."""
    base = paper_config(scale, data, scale.suite_steps, batch=scale.suite_batch)
    base["name"] = "accelerator-check"
    return base


def variants_part(check: Check, budget: Budget) -> dict[str, Any]:
    """The step table's first case (M5, 32 x 1024, no teachers) under each execution variant."""
    base = next(c for c in step_cases(check.scale, chosen=False) if c["teachers"] == 0)
    base = dict(base, torch=False, torch_compile=check.torch,
                **({} if check.torch else {"torch_skipped": "torch is not importable here"}))
    return variants.run(check, budget, base, bench._configs(base)[0].layers, bench.measure, PartError)


PART_FUNCS: dict[str, Callable[[Check, Budget], dict[str, Any]]] = {
    "data": data_part, "step": step_part, "variants": variants_part, "growth": growth_part, "engine": engine_part, "gpt_paper": gpt_paper_part,
    "gptl_vs_loire": gptl_vs_loire_part}


# --------------------------------------------------------------------------- the plan
def part_seconds(name: str, scale: Scale) -> float:
    if name == "step":
        return sum(case_seconds(c, scale.dry) for c in step_cases(scale))
    return PART_SECONDS[scale.dry][name]


def run_plan(check: Check, parts: list[str]) -> int:
    """Every selected part in order, each inside its share of what is left of the budget."""
    estimates = {p: part_seconds(p, check.scale) for p in parts}
    for name in PARTS:
        if name not in parts:
            check.results.part(name).update(status="not selected")
    check.results.write()
    for i, name in enumerate(parts):
        part = check.results.part(name)
        allowance = check.budget.share(estimates[name], sum(estimates[p] for p in parts[i + 1:]))
        part.update(status="running", allowance_s=round(allowance, 1), started=_now())
        check.results.write()
        print(f"[{name}] allowance {allowance:.0f} s", flush=True)
        start = time.monotonic()
        try:
            part["figures"] = PART_FUNCS[name](check, Budget(allowance))
            part["status"] = "ok"
        except Skipped as why:
            part.update(status="skipped", reason=str(why))
        except PartError as err:
            part.update(status="out of time" if str(err).startswith("out of time") else "failed", error=str(err))
        except (KeyboardInterrupt, Interrupted):
            part.update(status="interrupted", seconds=round(time.monotonic() - start, 1))
            check.results.write()
            raise
        except Exception as err:  # noqa: BLE001 - a part's bug must not cost the other parts
            part.update(status="failed", error=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
        part["seconds"] = round(time.monotonic() - start, 1)
        check.results.write()
        print(f"[{name}] {part['status']} in {part['seconds']:.0f} s"
              + (f": {part.get('error') or part.get('reason')}" if part["status"] not in ("ok",) else ""), flush=True)
    bad = [p for p in parts if check.results.part(p)["status"] in ("failed", "out of time")]
    return 1 if bad else 0


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
            out.append(f"    {', '.join(v for v, _ in variants.VARIANTS)}, {variants.COMBINED}; torch.compile beside "
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


# --------------------------------------------------------------------------- markdown
def _f(v: Any, fmt: str, dash: str = "–", suffix: str = "") -> str:
    """``v`` formatted, or a dash for a figure that is missing (or not finite)."""
    return dash if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt) + suffix


def markdown(data: dict[str, Any]) -> str:
    parts = {p["name"]: p for p in data["parts"]}
    dev = data.get("device") or {}
    v = data["versions"]
    lines = [f"# Accelerator check{' (dry run: toy shapes on the CPU, not figures)' if data['dry_run'] else ''}", "",
             f"- date: {data['started']} (updated {data['updated']}, {data['seconds']:.0f} s in)",
             f"- device: {dev.get('kind', 'unknown')} ({dev.get('devices') or data.get('devices_seen', '-')}); MFU peak: "
             + (f"{dev['peak_flops'] / 1e12:,.1f} TFLOP/s ({dev.get('peak_source')})" if dev.get("peak_flops") else "–"),
             "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val)
             + f"; commit {data.get('commit', 'unknown')}",
             f"- command: `{' '.join(data['command'])}`; budget {data['budget_min']:g} min", "", "## Parts", ""]
    lines += markdown_table(("part", "status", "seconds", "allowance s", "note"),
                            [(p["name"], p["status"], _f(p.get("seconds"), ".0f"), _f(p.get("allowance_s"), ".0f"),
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


def _rate(r: dict, prefix: str = "") -> str:
    from loire_jax.analysis.flops import mfu_text

    rate, mfu = r.get(prefix + "tokens_per_s"), r.get(prefix + "mfu")
    if rate is None:
        err = r.get(prefix + "error") or (r.get("error") if not prefix else None)
        return f"error: {err[:70]}" if err else "–"
    return f"{rate:,.0f}" + (f" ({mfu_text(mfu, bool(r.get('peak_measured')))})" if mfu is not None else "")


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
        rows.append((f"{r['label']}{dims}", f"{r['batch']} × {r['seq']}", str(r["teachers"]), _rate(r),
                     _f(r.get("compiled_peak_gib"), ".2f"), _f(r.get("device_peak_gib"), ".2f"),
                     _rate(r, "torch_") if r.get("torch") else "–",
                     _rate(r, "torch_compile_") if r.get("torch_compile") else "–", vs))
    lines += markdown_table(("shape (h, f, heads, L), V", "batch × seq", "teachers", "loire_jax tokens/s (MFU)",
                             "compiled peak GiB", "device peak GiB", "torch eager (MFU)", "torch.compile (MFU)",
                             "loire_jax / torch.compile"), rows)
    skipped = {r.get("torch_skipped") for r in part["records"] if r.get("torch_skipped")}
    if skipped:
        lines += ["", "PyTorch columns: " + "; ".join(sorted(skipped)) + "."]
    kd = part["figures"].get("kd_cost") or []
    if kd:
        lines += ["", "### KD cost: step time with k teachers over without", ""] + markdown_table(
            ("shape", "batch × seq", "1 teacher", "4 teachers"),
            [(k["label"], f"{k['batch']} × {k['seq']}", _f(k["ratio"].get("1"), ".2f", suffix="×"),
              _f(k["ratio"].get("4"), ".2f", suffix="×")) for k in kd])
    memory = part["figures"].get("memory_1b") or []
    if memory:
        lines += ["", "### 1.1B memory (its final stage)", ""] + markdown_table(
            ("teachers", "compiled peak GiB", "device peak GiB", "torch.compile peak GiB"),
            [(str(m["teachers"]), _f(m["compiled_peak_gib"], ".2f"), _f(m["device_peak_gib"], ".2f"),
              _f(m["torch_compile_peak_gib"], ".2f")) for m in memory])
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
          _f(r["tokens_per_s"], ",.0f"), "–" if r["mfu"] is None else mfu_text(r["mfu"]), _f(r["compile_s"], ".1f"),
          _f(r["compiled_peak_gib"], ".2f")) for r in part["records"]])
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
        lines += ["", f"LOIRE / GPT_L: FLOPs {_f(fig['flops_ratio'], '.1%')}, step time {_f(fig['steps_ratio'], '.1%')}, "
                      f"wall {_f(fig['wall_ratio'], '.1%')}.", "", compile_bench.summary(fig["compile"]) + "."]
    return lines


# --------------------------------------------------------------------------- the command
def open_out(text: str) -> Path:
    """The output directory, created or reused: a new or empty one, or one an earlier check
    made (its marker); refused (ValueError) when it is a file or holds other things."""
    out = Path(text).expanduser()
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {text} is a file; give a directory (new, empty, or an earlier check's)")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise ValueError(f"--out {text} is a non-empty directory that no accelerator check made; give a new or "
                         "empty one (nothing in it is touched)")
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("made by benchmarks/accelerator_check.py: its results and run-* folders\n")
    return out


def selected(text: str | None) -> list[str]:
    if text is None:
        return list(PARTS)
    names = [p.strip() for p in text.split(",")]
    unknown = [p for p in names if p not in PARTS]
    if unknown or not all(names):
        raise ValueError(f"--parts takes comma-separated names from {list(PARTS)}, got {text!r}")
    return [p for p in PARTS if p in names]  # the plan's order: later parts read earlier ones' results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="results.json, results.md and the runs' folders go here")
    parser.add_argument("--budget-min", type=float, default=25.0, help="wall-clock minutes for the whole plan")
    parser.add_argument("--parts", default=None, help=f"comma-separated subset of {','.join(PARTS)} (default: all)")
    parser.add_argument("--cases", default=None, help="the step part's cases to run, comma-separated names from "
                        "--list (default: all)")
    parser.add_argument("--dry-run", action="store_true", help="the same plan at toy shapes on the CPU")
    parser.add_argument("--list", action="store_true", help="print the plan (shapes, estimates, allowances); "
                        "run nothing")
    args = parser.parse_args(argv)
    try:
        if not (math.isfinite(args.budget_min) and args.budget_min > 0):
            raise ValueError(f"--budget-min must be a positive number of minutes, got {args.budget_min:g}")
        parts = selected(args.parts)
        scale = dataclasses.replace(DRY if args.dry_run else REAL, only=args.cases)
        step_cases(scale)  # --cases checked
        if args.list:
            print("\n".join(plan_lines(scale, args.budget_min, parts)))
            return 0
        out = open_out(args.out)
        work = out / f"run-{datetime.datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}"
        (work / "logs").mkdir(parents=True)
    except ValueError as err:
        return fail(err)
    except OSError as err:
        return fail(f"--out {args.out}: {err.strerror or err}")
    import jax

    jax.config.update("jax_platforms", "cpu")  # this process only plans and reads: the accelerator is the children's
    versions = _versions()
    head = {"tool": "benchmarks/accelerator_check.py",
            "command": ["python", "benchmarks/accelerator_check.py", *(sys.argv[1:] if argv is None else argv)],
            "started": _now(), "dry_run": scale.dry, "budget_min": args.budget_min, "work": str(work),
            "versions": versions, "python": sys.version.split()[0], "commit": variants.commit()}
    check = Check(out, work, scale, Budget(60 * args.budget_min), Results(out, head),
                  torch=importlib.util.find_spec("torch") is not None)
    head["probed"] = variants.probe_device(bench.run_child, check.env())
    signal.signal(signal.SIGTERM, _raise_interrupted)
    print(f"accelerator check{' (dry run)' if scale.dry else ''}: parts {', '.join(parts)}; budget "
          f"{args.budget_min:g} min; results in {out}", flush=True)
    try:
        code = run_plan(check, parts)
    except (KeyboardInterrupt, Interrupted):
        print(f"interrupted; what finished is in {out / 'results.md'}", file=sys.stderr)
        return 130
    print(f"results: {out / 'results.json'} and {out / 'results.md'}")
    return code


def _raise_interrupted(signum, frame) -> None:
    raise Interrupted()


if __name__ == "__main__":
    sys.exit(main())
