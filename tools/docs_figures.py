"""The figures README.md and docs/*.md quote, rendered from recorded runs, so that none goes stale.

    python tools/docs_figures.py --check            # exit 1 if a quoted figure differs from its record
    python tools/docs_figures.py --write            # rewrite the quoted figures from the records
    python tools/docs_figures.py --record NAME      # rerun NAME's command here and record it anew
    python tools/docs_figures.py --reproduce NAME   # rerun it in a temporary workdir and compare its
                                                    # deterministic figures with the record (nothing written)

A record is a folder ``docs/results/NAME/``: ``record.json`` (the command as typed, the
commit and version that ran it, the machine, the wall time, the exit code), the command's
``stdout.txt`` and ``stderr.txt`` (progress-bar redraws collapsed to what a terminal shows
last) and the run's own files (``config.json``, ``metrics.jsonl``, ``report/report.json``).

A benchmark's figures come from its ``--json`` file in ``benchmarks/results/`` instead (``bench:NAME``).
``--measure NAME`` prints a small measurement (Hugging Face import, XLA's FLOPs, float64 growth)
that a record runs as its command.

In README.md and docs/*.md a figure sits between ``<!-- figures:NAME -->`` and ``<!-- /figures -->``; the
text between the markers is exactly what ``render(NAME)`` returns. Wall times are quoted as
what they are, one measurement on the recorded machine; AP, AP+, Init - Prev final, the
FLOPs, the perplexity log and the growth deviations are deterministic, and the two recorded
default runs must agree on them (``--check`` says so if they do not).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
BENCH = ROOT / "benchmarks" / "results"  # bench_step.py --json files, read as ``bench:NAME``
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))  # the files that may hold figure markers
MARKER = re.compile(r"<!-- figures:([\w-]+) -->(.*?)<!-- /figures -->", re.S)


@dataclasses.dataclass(frozen=True)
class Recording:
    """A command whose output the docs quote. ``{workdir}`` in ``command`` is the run's workdir;
    ``keep`` are the workdir's files the record holds."""

    command: tuple[str, ...]
    keep: tuple[str, ...] = ()
    about: str = ""
    workdir: str | None = None  # a fixed workdir (relative to the repository root) instead of a fresh temporary one


_RUN_FILES = ("config.json", "metrics.jsonl", "report/report.json")
RECORDINGS = {
    "default-run-first": Recording(("python", "launch/train.py", "--mesh", "8", "--workdir", "{workdir}"), _RUN_FILES,
                                   "the default run on a fresh checkout: it prepares the corpus and compiles into an "
                                   "empty compilation cache"),
    "default-run": Recording(("python", "launch/train.py", "--mesh", "8", "--workdir", "{workdir}"), _RUN_FILES,
                             "the default run again, into a new workdir: corpus prepared, compilation cache warm"),
    "grow-demo": Recording(("python", "launch/grow_demo.py", "--mesh", "8"), (), "the growth demo"),
    # LOIRE-GPT2 as docs/results.md types it: the second run starts from the first's runs/tiny_gpt2_general/stage_1
    "gpt2-plm": Recording(("python", "launch/train.py", "--config", "configs/tiny_gpt2_general.yaml", "--mesh", "8"),
                          _RUN_FILES, "the PLM that LOIRE-GPT2 starts from", workdir="runs/tiny_gpt2_general"),
    "gpt2-loire": Recording(("python", "launch/train.py", "--config", "configs/tiny_gpt2.yaml", "--mesh", "8"),
                            _RUN_FILES, "LOIRE-GPT2: the default schedule from the PLM", workdir="runs/tiny_gpt2"),
    "bert-tiny": Recording(("python", "launch/train.py", "--config", "bert_tiny", "--mesh", "8", "--workdir",
                            "{workdir}"), _RUN_FILES, "LOIRE-Bert's five stages at CPU scale"),
    "data-prepare": Recording(("python", "-m", "loire_jax.data", "prepare"), (),
                              "the default corpus's second prepare: verify the cache, print the table"),
    "bench-data": Recording(("python", "benchmarks/bench_data.py"), (), "the data pipeline's tokens/s"),
    "bench-compile": Recording(("python", "benchmarks/bench_compile.py"), (),
                               "GPT_L against LOIRE at the default run's shapes: compile time cache off, into an "
                               "empty persistent cache, and warm"),
    "hf-import": Recording(("python", "tools/docs_figures.py", "--measure", "hf-import"), (),
                           "loire_jax's logits on the Hugging Face fixtures against transformers' saved ones"),
    "flops-xla": Recording(("python", "tools/docs_figures.py", "--measure", "flops-xla"), (),
                           "the analytic training FLOPs against XLA's cost analysis of the compiled step"),
    "growth-f64": Recording(("python", "tools/docs_figures.py", "--measure", "growth-f64"), (),
                            "max |dlogits| of each growth step in float64, per preset"),
}


# --------------------------------------------------------------------------- records
def terminal_text(raw: str) -> str:
    """What a terminal shows at the end: each line's last carriage-return segment (tqdm redraws
    its bar with ``\\r``), without the blank lines the bars leave."""
    lines = [line.rsplit("\r", 1)[-1].rstrip() for line in raw.split("\n")]
    return "\n".join(line for line in lines if line) + "\n"


def machine() -> str:
    """The machine in words: cores, CPU model, memory."""
    model = platform.processor() or platform.machine()
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        model = names[0] if names else model
    except OSError:
        pass
    try:
        pages = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        memory = f", {pages / 2**30:.0f} GiB"
    except (ValueError, OSError, AttributeError):
        memory = ""
    return f"a {os.cpu_count()}-core {model} {platform.machine()} machine{memory}"


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def store(name: str, command: list[str], workdir: Path | None, stdout: str, stderr: str, *, wall_s: float,
          exit_code: int, started: str, machine_text: str, load_text: str) -> Path:
    """Write the record ``docs/results/NAME`` of one finished command (replacing an old one)."""
    from importlib.metadata import version

    out = RESULTS / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / "stdout.txt").write_text(terminal_text(stdout))
    (out / "stderr.txt").write_text(terminal_text(stderr))
    for rel in RECORDINGS[name].keep:
        src = workdir / rel
        if src.exists():
            shutil.copyfile(src, out / Path(rel).name)
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    record = {
        "name": name, "about": RECORDINGS[name].about, "command": " ".join(command), "cwd": "the repository root",
        "commit": _git("rev-parse", "HEAD"), "uncommitted_changes": dirty not in ("", "unknown"),
        "version": version("loire_jax"), "jax": version("jax"), "python": platform.python_version(),
        "machine": machine_text, "load_average": load_text, "started": started, "wall_s": round(wall_s, 1), "exit_code": exit_code,
    }
    (out / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    return out


def record(name: str, workdir: Path | None = None) -> Path:
    """Run NAME's command as a user types it (``python`` is this interpreter) and store it."""
    spec = RECORDINGS[name]
    if spec.workdir is not None:
        workdir = ROOT / spec.workdir
        if workdir.exists():  # it would resume, not run: a record must come from a whole run
            raise SystemExit(f"error: {workdir} exists; move it away to record {name}")
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"loire-{name}-")) / "run"
    command = [part.format(workdir=workdir) for part in spec.command]
    started, load = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), _load()
    t = time.perf_counter()
    done = subprocess.run([sys.executable, *command[1:]], cwd=ROOT, capture_output=True)  # bytes: keep the \r
    wall = time.perf_counter() - t
    stdout, stderr = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    load_text = f"{load:.1f} at the start, {_load():.1f} at the end"
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(command)} exited {done.returncode}: {stderr.strip()[-500:]}")
    return store(name, command, workdir, stdout, stderr, wall_s=wall, exit_code=done.returncode,
                 started=started, machine_text=machine(), load_text=load_text)


def load(name: str) -> dict[str, Any]:
    """A record's files: ``record`` (record.json), ``stdout``, ``stderr`` and, for a run, ``report``
    (the run's summary from report.json). ``bench:NAME``: ``rows``, benchmarks/results/NAME.json."""
    if name.startswith("bench:"):
        path = BENCH / f"{name[len('bench:'):]}.json"
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist; bench_step.py --json writes it")
        return {"rows": json.loads(path.read_text()), "path": f"benchmarks/results/{path.name}"}
    folder = RESULTS / name
    if not (folder / "record.json").exists():
        raise FileNotFoundError(f"{folder} holds no record.json; make it with: python tools/docs_figures.py "
                                f"--record {name}")
    got: dict[str, Any] = {"record": json.loads((folder / "record.json").read_text()),
                           "stdout": (folder / "stdout.txt").read_text(), "stderr": (folder / "stderr.txt").read_text()}
    if (folder / "report.json").exists():
        report = json.loads((folder / "report.json").read_text())
        if "verdicts" in report:  # a comparison suite's report: every system's runs and the verdicts
            got["suite"] = report
        else:
            (got["report"],) = report["runs"]
    return got


# --------------------------------------------------------------------------- measurements
def measure_hf_import() -> None:
    """loire_jax's float32 logits on tests/fixtures/hf against the ones transformers saved."""
    import jax
    import numpy as np

    from loire_jax import apply_model
    from loire_jax.interop import hf

    fixtures = ROOT / "tests" / "fixtures" / "hf"
    tokens = np.load(fixtures / "tokens.npy")
    with jax.default_matmul_precision("highest"):
        for name in ("gpt2", "llama_gqa", "llama_tied"):
            cfg, params = hf.load(fixtures / name)
            got = np.asarray(apply_model(cfg, params, tokens), np.float64)
            want = np.load(fixtures / name / "logits.npy").astype(np.float64)
            largest = np.max(np.abs(want))
            print(f"{name}: max |dlogits| {np.max(np.abs(got - want)):.2e}, largest logit {largest:.3f}, "
                  f"relative {np.max(np.abs(got - want)) / largest:.1e}")


def measure_flops_xla() -> None:
    """The analytic training FLOPs of one layer's step (dense attention) against XLA's cost
    analysis of the compiled step, without and with a teacher (tests/test_flops.py's shapes)."""
    import jax

    from loire_jax import init_params, preset
    from loire_jax.analysis.flops import train_flops_per_token
    from loire_jax.train.optimizer import make_optimizer
    from loire_jax.train.state import init_state
    from loire_jax.train.step import StepSpec, make_train_step

    batch, seq = 4, 64
    student = preset("paper", vocab_size=512, max_seq_len=seq, hidden=256, ffn=1024, heads=4, head_dim=64, layers=1)
    teacher = student.replace(hidden=128, ffn=512, heads=2)
    opt = make_optimizer("adam", learning_rate=1e-3)
    for label, teachers in (("no teacher", ()), ("one teacher", (teacher,))):
        spec = StepSpec(student, teachers=teachers, betas=(0.1,) * len(teachers))
        params = jax.eval_shape(lambda: init_params(student, jax.random.key(0)))
        state = jax.eval_shape(lambda p: init_state(p, opt), params)
        shapes = tuple(jax.eval_shape(lambda c=c: init_params(c, jax.random.key(0))) for c in teachers)
        tokens = {"tokens": jax.ShapeDtypeStruct((batch, seq + 1), jax.numpy.int32)}
        cost = jax.jit(make_train_step(spec, opt)).lower(state, tokens, shapes).compile().cost_analysis()
        compiled = float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])
        analytic = batch * seq * train_flops_per_token(student, seq, teachers, causal=False)
        print(f"{label}: compiled {compiled:.4e}, analytic {analytic:.4e}, compiled/analytic - 1 = "
              f"{100 * (compiled / analytic - 1):+.1f}%")


def measure_growth_f64() -> None:
    """max |dlogits| against the original after each step of the paper's schedule (hidden, ffn,
    heads, layers), in float64, for each preset."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np

    from loire_jax import apply_model, grow, init_params, preset

    tokens = np.random.default_rng(0).integers(0, 256, (2, 32))
    with jax.default_matmul_precision("highest"):
        for name in ("paper", "gpt2", "modern"):
            cfg = preset(name, vocab_size=256, max_seq_len=32, hidden=32, ffn=64, heads=2, head_dim=16, layers=2,
                         dtype="float64", param_dtype="float64")
            params = init_params(cfg, jax.random.key(0))
            base = np.asarray(apply_model(cfg, params, tokens))
            for k, (op, size) in enumerate((("hidden", 64), ("ffn", 128), ("heads", 4), ("layers", 4))):
                cfg, params = grow(cfg, params, op, size, jax.random.key(k + 1))
                delta = np.max(np.abs(np.asarray(apply_model(cfg, params, tokens)) - base))
                print(f"{name} {op}: max |dlogits| {delta:.1e}")


MEASURES: dict[str, Callable[[], None]] = {
    "hf-import": measure_hf_import, "flops-xla": measure_flops_xla, "growth-f64": measure_growth_f64}


# --------------------------------------------------------------------------- deterministic figures
def run_figures(report: dict[str, Any], stdout: str) -> dict[str, Any]:
    """What a rerun of the same run on the same platform reproduces exactly: everything but times."""
    return {
        "AP": [row["AP"] for row in report["lifelong"]],
        "AP+": [row["AP+"] for row in report["lifelong"]],
        "init_minus_prev": [p["delta"] for p in report["preservation"]],
        "flops": [s["flops"] for s in report["stages"]],
        "params": [s["params"] for s in report["stages"]],
        "ppl_log": ppl_lines(stdout),
    }


def ppl_lines(stdout: str) -> list[str]:
    """The trainer's evaluation lines, ``  [init] stage 2 PPL: WB 2941.15, NEWS 3369.51``."""
    return [line for line in stdout.splitlines() if re.match(r"\s*\[(init|final)\] stage \d+ PPL:", line)]


def demo_rows(stdout: str) -> list[tuple[str, ...]]:
    """The growth demo's table rows (step, operator, shape, params, max |dlogits|), seconds left out."""
    rows = re.findall(r"^(M\d)\s+(\S+)\s+(\(\d+, \d+, \d+, \d+\))\s+([\d,]+)\s+([\d.e+-]+)", stdout, re.M)
    if len(rows) != 5:
        raise ValueError(f"the growth demo's output holds {len(rows)} table rows, not 5")
    return rows


# --------------------------------------------------------------------------- rendering
def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def _num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}".replace("-", "−")


def _prep_seconds(stderr: str) -> float | None:
    found = re.search(r"\[loire_jax\.data\] ready in ([\d.]+)s", stderr)
    return float(found.group(1)) if found else None


def _cmd(rec: dict[str, Any]) -> str:
    return f"`{rec['record']['command']}`"


def _on(rec: dict[str, Any]) -> str:
    """Where and how loaded: ``on a 2-core ... machine (load average 8.7 at the start, 19.4 at the end)``."""
    return f"on {rec['record']['machine']} (load average {rec['record']['load_average']})"


def _prose(text: str) -> str:
    return textwrap.fill(text, width=90, break_on_hyphens=False, break_long_words=False) + "\n"


def fig_default_run_log(got: Callable[[str], dict[str, Any]]) -> str:
    first, warm = got("default-run-first"), got("default-run")
    prep = _prep_seconds(first["stderr"])
    lines = ppl_lines(warm["stdout"])
    shown = [*lines[1:5], "  ...", lines[-1]]
    return _prose(
        f"Measured once each, {_on(first)}: in a fresh checkout, {_cmd(first)} took "
        f"**{_duration(first['record']['wall_s'])}** wall, {_duration(prep or 0)} of it preparing the corpus, and "
        f"compiled into an empty compilation cache. Into a new workdir, with both warm, {_cmd(warm)} took "
        f"**{_duration(warm['record']['wall_s'])}** (load average {warm['record']['load_average']}). Records: `docs/results/default-run-first`, "
        "`docs/results/default-run`. The function-preservation check reads straight off the log:"
    ) + "\n```\n" + "\n".join(shown) + "\n```\n"


def fig_default_run_report(got: Callable[[str], dict[str, Any]]) -> str:
    rec = got("default-run")
    run = rec["report"]
    worst = max(((p["delta"], p["previous_final"]) for p in run["preservation"] if p["delta"] is not None),
                key=lambda pair: abs(pair[0]))
    table = _report_table(run, "")
    return _prose(
        "The default run's report (`runs/tiny/report/report.md`), from `docs/results/default-run`. The wall "
        f"times are one measurement, by {_cmd(rec)} {_on(rec)}. The other rows are deterministic: both "
        "recorded runs agree on them bit for bit. On another CPU the last digits of Init − Prev final may "
        + (f"differ: its largest value here, {_num(worst[0], 4)} at an AP of {_num(worst[1])}, is float32 "
           f"rounding ({abs(worst[0]) / worst[1]:.0e} relative)." if worst[0] else
           "differ from the exact zeros recorded here by float32 rounding.")
    ) + "\n" + table


def _report_table(run: dict[str, Any], corner: str) -> str:
    """A run report's per-stage rows: AP, AP+, Init − Prev final, FLOPs and wall time."""
    n = len(run["stages"])
    pres = {p["stage"]: p["delta"] for p in run["preservation"]}
    rows = [
        ["AP"] + [_num(r["AP"]) for r in run["lifelong"]],
        ["AP+"] + [_num(r["AP+"]) for r in run["lifelong"]],
        ["Init − Prev final (AP)"] + [_num(pres.get(k + 1), 4) if k else "-" for k in range(n)],
        ["training FLOPs"] + [f"{s['flops']:.2e}" for s in run["stages"]],
        ["wall (s)"] + [_num(s["wall_s"], 1) for s in run["stages"]],
    ]
    table = [(f"| {corner} | " if corner else "| | ") + " | ".join(f"M{k + 1}" for k in range(n)) + " |", "|---" * (n + 1) + "|"]
    return "\n".join(table + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def fig_default_run_wall(got: Callable[[str], dict[str, Any]]) -> str:
    first, warm = got("default-run-first"), got("default-run")
    return _prose(
        f"The default `--mesh 8` run of all five stages took {_duration(first['record']['wall_s'])} on first use "
        f"(corpus preparation included, compilation cache empty) and {_duration(warm['record']['wall_s'])} with "
        f"both warm: one measurement each, {_on(warm)} (`docs/results/default-run-first`, "
        "`docs/results/default-run`).")


def fig_grow_demo(got: Callable[[str], dict[str, Any]]) -> str:
    rec = got("grow-demo")
    rows = demo_rows(rec["stdout"])
    lines = [f"{'step':<6}{'operator':<10}{'(hidden, ffn, heads, layers)':<30}{'params':>14}{'max |dlogits|':>16}"]
    lines += [f"{s:<6}{op:<10}{shape:<30}{params:>14}{delta:>16}" for s, op, shape, params, delta in rows]
    tolerance = re.search(r"tolerance on max \|dlogits\|: (\S+)", rec["stdout"])
    return _prose(
        f"Measured (float32, 8 simulated CPU devices) by {_cmd(rec)} {_on(rec)}, recorded in "
        "`docs/results/grow-demo`. The deviations are float32 rounding: their last digits differ from one CPU to "
        f"another, far below the demo's tolerance of {tolerance.group(1) if tolerance else '?'}."
    ) + "\n```\n" + "\n".join(lines) + "\n```\n"


def fig_gpt2(got: Callable[[str], dict[str, Any]]) -> str:
    plm, gpt2, gpt1 = got("gpt2-plm"), got("gpt2-loire"), got("default-run")
    plm_wb = re.search(r"\[final\] stage 1 PPL: WB ([\d.]+)", plm["stdout"]).group(1)
    start_wb = re.search(r"\[init\] stage 1 PPL: WB ([\d.]+)", gpt2["stdout"]).group(1)
    pres = [p["delta"] for p in gpt2["report"]["preservation"] if p["delta"] is not None]

    def row(label: str, run: dict[str, Any]) -> str:
        cells = [_num(r["AP"]) if r["AP+"] is None else f"{_num(r['AP'])} / {_num(r['AP+'])}" for r in run["lifelong"]]
        return f"| {label} | " + " | ".join(cells) + " |"

    n = len(gpt2["report"]["lifelong"])
    worse = [k + 1 for k, (a, b) in enumerate(zip(gpt2["report"]["lifelong"], gpt1["report"]["lifelong"]))
             if a["AP"] >= b["AP"]]
    table = ["| run | M1 AP | " + " | ".join(f"M{k + 1} AP / AP+" for k in range(1, n)) + " |", "|---" * (n + 1) + "|",
             row("LOIRE-GPT1 (`tiny`, M1 from scratch)", gpt1["report"]),
             row("LOIRE-GPT2 (`tiny_gpt2`, M1 from the PLM)", gpt2["report"])]
    return _prose(
        f"Measured once each {_on(plm)}, 8 simulated devices, data prepared: the PLM run took "
        f"{_duration(plm['record']['wall_s'])} and LOIRE-GPT2's five stages {_duration(gpt2['record']['wall_s'])} "
        f"(`docs/results/gpt2-plm`, `docs/results/gpt2-loire`, made by the two commands above). Stage 1 starts "
        f"where the PLM ended (WB {plm_wb} after the PLM, {start_wb} at stage 1's start), and every later Init is "
        f"within {max(abs(d) for d in pres):.4f} AP of the previous Final. `python launch/report.py runs/tiny "
        "runs/tiny_gpt2` puts the two side by side (AP, lower is better; AP+, negative means earlier domains "
        "improved):"
    ) + "\n" + "\n".join(table) + "\n\n" + _prose(
        f"At this scale ({gpt2['report']['stages'][0]['steps']} steps a stage) the PLM start lowers AP at "
        + ("every stage." if not worse else f"every stage but {', '.join(f'M{k}' for k in worse)}."))


# (label, default vocabulary) of bench_step.py's shapes: configuration, not measurement
_SHAPES = {"tiny": ("tiny (128, 512, 8, 4)", 8192), "m1": ("paper M1 (384, 1024, 6, 6)", 50257),
           "m5": ("paper M5 (768, 2048, 12, 12)", 50257), "1b": ("1.1B final stage (2048, 6144, 32, 24)", 50257)}


def _int(x: float) -> str:
    return f"{round(x):,}"


def _bench_rows(rows: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    found = [r for r in rows if all(r[k] == v for k, v in match.items())]
    if not found:
        raise ValueError(f"no benchmark row has {match}")
    return found


def fig_bench_throughput(got: Callable[[str], dict[str, Any]]) -> str:
    m1, tiny = got("bench:cpu-m1-target"), got("bench:cpu-tiny")
    table = ["| shape (h, f, heads, L), vocab | batch × seq | teachers | loire_jax tokens/s | PyTorch eager tokens/s |",
             "|---|---|---|---|---|"]
    (r,) = _bench_rows(m1["rows"], shape="m1", teachers=0)
    label, vocab = _SHAPES["m1"]
    table.append(f"| {label}, {r['vocab'] or vocab}, {r['dtype']} | {r['batch']} × {r['seq']} | 0 | "
                 f"{_int(r['tokens_per_s'])} ({100 * r['mfu']:.1f}% MFU) | {_int(r['torch_tokens_per_s'])} |")
    for dtype, name in (("float32", None), ("bfloat16", "tiny, bf16 compute")):
        rows = sorted(_bench_rows(tiny["rows"], shape="tiny", dtype=dtype), key=lambda row: row["teachers"])
        label, vocab = _SHAPES["tiny"]
        name = name or f"{label}, {rows[0]['vocab'] or vocab}, {dtype}"
        table.append(f"| {name} | {rows[0]['batch']} × {rows[0]['seq']} | "
                     f"{' / '.join(str(row['teachers']) for row in rows)} | "
                     f"{' / '.join(_int(row['tokens_per_s']) for row in rows)} | "
                     f"{' / '.join(_int(row['torch_tokens_per_s']) for row in rows)} |")
    return _prose(
        "Measured on this project's 2-core CPU machine, one device, by the two commands below; "
        f"the records are `{m1['path']}` and `{tiny['path']}` (torch {r['torch_version']}). Each figure is the "
        "median of the benchmark's repeats in one sitting on a shared machine, not a promise:"
    ) + "\n" + "\n".join(table) + "\n"


def fig_bench_memory(got: Callable[[str], dict[str, Any]]) -> str:
    rec = got("bench:cpu-compile-remat-dots")
    table = ["| shape | batch × seq | 0 teachers | 1 teacher | 4 teachers |", "|---|---|---|---|---|"]
    for shape in ("m1", "m5", "1b"):
        rows = sorted(_bench_rows(rec["rows"], shape=shape, dtype="bfloat16", remat="dots", compile_only=True),
                      key=lambda row: row["teachers"])
        label, vocab = _SHAPES[shape]
        table.append(f"| {label}, {rows[0]['vocab'] or vocab} | {rows[0]['batch']} × {rows[0]['seq']} | "
                     + " | ".join(f"{row['compiled_peak_gib']:.2f} GiB" for row in rows) + " |")
    return _prose(
        f"Memory of the compiled bf16 step with `remat=dots` (the GPU and TPU default), from XLA's memory "
        f"analysis on CPU with XLA attention and {rec['rows'][0]['loss_chunk']}-token loss blocks (`--shapes "
        "m1,m5,1b --teachers 0,1,4 --dtypes float32,bfloat16 --compile-only --remat dots --loss-chunk 1024 "
        f"--json`; recorded in `{rec['path']}`); cuDNN attention on a GPU needs less:"
    ) + "\n" + "\n".join(table) + "\n"


def _measured_lines(stdout: str, pattern: str) -> list[tuple[str, ...]]:
    found = re.findall(pattern, stdout, re.M)
    if not found:
        raise ValueError(f"the recorded output holds no line matching {pattern!r}")
    return found


def fig_flops_xla(got: Callable[[str], dict[str, Any]]) -> str:
    rec = got("flops-xla")
    gaps = {k: float(v) for k, v in _measured_lines(rec["stdout"], r"^(no teacher|one teacher): .* = ([+-][\d.]+)%$")}

    def said(gap: float) -> str:
        return f"{abs(gap):.1f}% {'more' if gap >= 0 else 'less'}"

    return _prose(
        f"Measured by {_cmd(rec)} {_on(rec)} (`docs/results/flops-xla`): XLA counts "
        f"{said(gaps['no teacher'])} than the analytic count without a teacher and {said(gaps['one teacher'])} "
        "with one, from norms, softmax and Adam, which the analytic count leaves out.")


def fig_hf_import(got: Callable[[str], dict[str, Any]]) -> str:
    rec = got("hf-import")
    rows = _measured_lines(rec["stdout"], r"^(\w+): max \|dlogits\| \S+, largest logit \S+, relative (\S+)$")
    return _prose(
        "Measured on the three fixtures (" + ", ".join(f"{name} {rel}" for name, rel in rows) + " of the "
        f"largest logit) by {_cmd(rec)} {_on(rec)}, recorded in `docs/results/hf-import`. The last digits "
        "depend on the CPU.")


def fig_growth_f64(got: Callable[[str], dict[str, Any]]) -> str:
    rec = got("growth-f64")
    rows = _measured_lines(rec["stdout"], r"^(\w+) (\w+): max \|dlogits\| (\S+)$")
    values = sorted({float(d) for _, _, d in rows})
    presets = sorted({p for p, _, _ in rows})
    return _prose(
        f"Measured in float64 after each step of the schedule hidden → ffn → heads → layers on the "
        f"{', '.join(presets)} presets: max |Δlogits| from {values[0]:.1e} to {values[-1]:.1e}, by {_cmd(rec)} "
        f"{_on(rec)} (`docs/results/growth-f64`).")


def fig_data_prepare(got: Callable[[str], dict[str, Any]]) -> str:
    first, again = got("default-run-first"), got("data-prepare")
    ready = _prep_seconds(first["stderr"])
    bpe = re.search(r"BPE trained in ([\d.]+)s", first["stderr"])
    table = [line for line in again["stdout"].splitlines() if not line.startswith(("summary written", "tokenizer:"))]
    return _prose(
        "Measured on this 2-core machine: the first build (all five domains and the BPE), inside the default "
        f"run's first use (`docs/results/default-run-first`), took {ready:.1f} s, "
        f"{float(bpe.group(1)) if bpe else 0:.1f} s of it training the BPE; a second {_cmd(again)} "
        f"verified the cache in {again['record']['wall_s']:.1f} s wall ({_on(again)}, "
        "`docs/results/data-prepare`). Its table:"
    ) + "\n```\n" + "\n".join(table) + "\n```\n"


def fig_bench_data(got: Callable[[str], dict[str, Any]]) -> str:
    rec = got("bench-data")
    setting = re.search(r"^domain=(\S+) seq_len=(\d+) batch=(\d+) replay=(\S+) threads=\d+ batches/repeat=(\d+)$",
                        rec["stdout"], re.M)
    runs = re.search(r"^tokens/s per repeat: (.+)$", rec["stdout"], re.M).group(1).split(", ")
    median = re.search(r"^median pipeline tokens/s: (\S+)$", rec["stdout"], re.M).group(1)
    domain, seq, batch, replay, n = setting.groups()
    return _prose(
        f"{_cmd(rec)} ({domain} domain with {replay} replay, seq_len {seq}, batch {batch}, {int(n):,} batches × "
        f"{len(runs)} repeats): a median of {median} tokens/s, {_on(rec)} (`docs/results/bench-data`).")


def _compile_rows(stdout: str) -> dict[tuple[str, str], tuple[str, ...]]:
    """bench_compile.py's table: (system, pass) -> (programs, compile s, tracing s, wall s, FLOPs)."""
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0] in ("GPT_L", "LOIRE"):
            rows[cells[0], cells[1]] = tuple(cells[2:])
    if len(rows) != 6:
        raise ValueError(f"bench_compile's table has {len(rows)} of its 6 rows")
    return rows


def _compile_ratios(stdout: str) -> dict[str, str]:
    """bench_compile.py's summary line, as printed: LOIRE / GPT_L per pass, warm / cold per system."""
    found = re.search(r"^LOIRE / GPT_L compile: (\S+) cache off, (\S+) empty cache, (\S+) warm cache; "
                      r"warm / cold: GPT_L (\S+), LOIRE (\S+);", stdout, re.M)
    if not found:
        raise ValueError("bench_compile's summary line is missing")
    keys = ("cache off", "empty cache", "warm cache", "GPT_L warm", "LOIRE warm")
    return {k: v.replace("x", "×") for k, v in zip(keys, found.groups())}


def fig_bench_compile(got: Callable[[str], dict[str, Any]]) -> str:
    rec = got("bench-compile")
    rows = _compile_rows(rec["stdout"])
    passes = ("cache off", "empty cache", "warm cache")
    table = ["| compile s (of which tracing) | " + " | ".join(passes) + " |", "|---|---|---|---|"]
    for system in ("GPT_L", "LOIRE"):
        table.append(f"| {system} | " + " | ".join(f"{rows[system, p][1]} ({rows[system, p][2]})" for p in passes)
                     + " |")

    ratios = _compile_ratios(rec["stdout"])

    def ratio(p: str) -> str:
        return ratios[p]

    def warm(system: str) -> str:
        return ratios[f"{system} warm"]

    return _prose(
        f"{_cmd(rec)} ({_duration(rec['record']['wall_s'])} {_on(rec)}; `docs/results/bench-compile`): GPT_L and "
        f"LOIRE derived from the default run's config, 20 steps a stage, each compiling {rows['LOIRE', 'cache off'][0]} "
        f"programs over five stages (a training step and an evaluation per stage). LOIRE / GPT_L compile time: "
        f"{ratio('cache off')} with the cache off, {ratio('empty cache')} into an empty cache (GPT_L's five stages "
        f"share one shape, so stages 2–5 load stage 1's programs), {ratio('warm cache')} warm. A warm rerun's compile "
        f"time is {warm('LOIRE')} of the cold one for LOIRE and {warm('GPT_L')} for GPT_L; tracing, which no cache "
        "saves, is most of what is left:"
    ) + "\n" + "\n".join(table) + "\n"


def fig_bert_tiny_report(got: Callable[[str], dict[str, Any]]) -> str:
    rec = got("bert-tiny")
    return _prose(
        f"The report of {_cmd(rec)}, which took {_duration(rec['record']['wall_s'])} {_on(rec)} (one measurement; "
        "`docs/results/bert-tiny`). Perplexities are masked-LM ones, exp(mean CE over the masked tokens) on the "
        "fixed validation masks, so they are not comparable with a decoder's; Init − Prev final is the growth "
        "step's own change on the same masks:"
    ) + "\n" + _report_table(rec["report"], "`bert_tiny`")


def fig_bench_encoder(got: Callable[[str], dict[str, Any]]) -> str:
    rec = got("bench:cpu-encoder-vs-decoder")
    table = ["| shape (h, f, heads, L), vocab, batch × seq | decoder tokens/s | encoder tokens/s | encoder / decoder |",
             "|---|---|---|---|"]
    for shape in ("tiny", "m1"):
        dec, = _bench_rows(rec["rows"], shape=shape, kind="decoder", teachers=0)
        enc, = _bench_rows(rec["rows"], shape=shape, kind="encoder", teachers=0)
        label, vocab = _SHAPES[shape]
        table.append(f"| {label}, {dec['vocab'] or vocab}, {dec['batch']} × {dec['seq']} | "
                     f"{_int(dec['tokens_per_s'])} | {_int(enc['tokens_per_s'])} | "
                     f"{enc['tokens_per_s'] / dec['tokens_per_s']:.2f} |")
    return _prose(
        "The encoder's train step against the paper's decoder of the same shape, float32 on one CPU device, "
        "measured one after the other in one sitting by `python benchmarks/bench_step.py --shapes tiny,m1 --kinds "
        "decoder,encoder --batch 8 --seq 256 --vocab 8192 --mesh 1 --repeats 5 --json` (median of 5 repeats of 10 "
        "steps; "
        f"recorded in `{rec['path']}`, on a machine shared with other jobs). The encoder adds its MLM transform "
        "and draws its masks on the device, and runs its output layer at the masked positions only:"
    ) + "\n" + "\n".join(table) + "\n"


def _suite_rows(suite: dict[str, Any]) -> list[str]:
    """Per system: counted runs, M1 and M5 AP, M5 AP+ (the report's cells) and mean FLOPs."""
    from loire_jax.analysis.tables import stat_cell as cell

    rows = ["| system | counted runs | M1 AP | M5 AP | M5 AP+ | training FLOPs |", "|---|---|---|---|---|---|"]
    for system, a in suite["aggregate"].items():
        flops = [st["mean"] for st in a["flops"] if st]
        rows.append(f"| {system} | {a['counted']}/{a['runs']} | {cell(a['AP'][0])} | {cell(a['AP'][-1])} | "
                    f"{cell(a['AP+'][-1])} | {sum(flops):.3g} |")
    return rows


def _verdict_rows(suite: dict[str, Any], *, numbers: bool) -> list[str]:
    """The verdicts judged anew from the recorded runs (``analysis.claims.verdicts``), so the
    docs show today's rule on the record's numbers, with what each verdict tests."""
    from loire_jax.analysis.claims import verdicts

    head = ("| the paper's claim (where) | paper | what it tests | measured | verdict |\n|---|---|---|---|---|"
            if numbers else "| the paper's claim (where) | paper | what it tests | verdict |\n|---|---|---|---|")
    rows = [head]
    for v in verdicts(suite["runs"], suite["suite"].get("downstream_tasks") or ()):
        measured = f" {v['metric']}: {'; '.join(v['numbers'])} |" if numbers else ""
        rows.append(f"| {v['claim']} ({v['where']}) | {v['paper']} | {v['tests']} |{measured} **{v['verdict']}** |")
    return rows


def _finetune_seconds(stdout: str) -> list[float]:
    """Each of a suite's downstream fine-tunings' seconds, from its ``done in N s`` lines."""
    return [float(x) for x in re.findall(r"^\[downstream \d+/\d+\] .*: done in (\d+) s;", stdout, re.M)]


def _suite_wall(rec: dict[str, Any], short: bool = False) -> str:
    n = sum(len(runs) for runs in rec["suite"]["runs"].values()) + len(rec["suite"]["sweep"])
    tunes = _finetune_seconds(rec["stdout"])
    what = f"{n} runs" + (f" and {len(tunes)} fine-tunings" if tunes else "")
    out = f"{_cmd(rec)} ran {what} in **{_duration(rec['record']['wall_s'])}** {_on(rec)}"
    if not short:
        out += ", into an empty workdir and an empty compilation cache, with the corpus already prepared"
    out += " (one measurement)"
    if tunes:
        tunes.sort()
        out += (f". The downstream part took {_duration(sum(tunes))} of it: "
                f"{tunes[len(tunes) // 2]:.0f} s a fine-tuning at the median, {tunes[-1]:.0f} s at most")
    return out


def _table5_rows(suite: dict[str, Any]) -> list[str]:
    """The report's Table 5 rows (``analysis.downstream.table``), from the suite's report."""
    from loire_jax.analysis.downstream import table

    tasks = suite["suite"].get("downstream_tasks") or []
    if not tasks:
        return []
    rows = ["| system | counted runs | " + " | ".join(tasks) + " | average | paper average |",
            "|---" * (len(tasks) + 4) + "|"]
    return rows + ["| " + " | ".join(row) + " |" for row in table(suite["runs"], tasks)]


def fig_paper_mini(got: Callable[[str], dict[str, Any]]) -> str:
    rec = got("paper-mini")
    suite = rec["suite"]["suite"]
    return _prose(
        f"{_suite_wall(rec)}. The sweep chose `{' '.join(suite['setting'])}` ({suite['why']}). Its report "
        "(`docs/results/paper-mini/report.md`), over seeds " + ", ".join(map(str, suite["seeds"])) + ":"
    ) + "\n" + "\n".join(_verdict_rows(rec["suite"], numbers=True)) + "\n\n" + "\n".join(
        _suite_rows(rec["suite"])) + "\n" + ("\nDownstream (Table 5): validation accuracy of the final models, "
                                             "fine-tuned at each run's seed (`downstream:` in the suite):\n\n"
                                             + "\n".join(rows) + "\n" if (rows := _table5_rows(rec["suite"])) else "")


def fig_paper_mini_verdicts(got: Callable[[str], dict[str, Any]]) -> str:
    rec = got("paper-mini")
    counts = sorted({len(runs) for runs in rec["suite"]["runs"].values()})
    seeds = f"{counts[0]} seeds each" if len(counts) == 1 else f"{counts[0]} to {counts[-1]} seeds a system"
    return _prose(
        f"The paper's comparisons at CPU scale (`--suite paper-mini`: {len(rec['suite']['runs'])} systems, its two "
        f"rivals ELLE and LiGO among them, derived from `configs/mini.yaml`, {seeds}): "
        f"{_suite_wall(rec, short=True)}. Each verdict "
        "pairs LOIRE with each opponent seed by seed (a paired t interval, Bonferroni over the claims; "
        "*no material effect* inside a stated margin); the paired numbers behind each verdict are in "
        "[docs/results.md](docs/results.md#paper-mini-and-how-to-read-its-report)."
    ) + "\n" + "\n".join(_verdict_rows(rec["suite"], numbers=False)) + "\n"


ACCELERATOR = BENCH / "accelerator"  # an accelerator_check.py --out folder's results.json and results.md, copied here
CHECK_SCRIPT = ROOT / "benchmarks" / "accelerator_check.py"  # its markdown renders the GPU table


def _accelerator_script():
    """benchmarks/accelerator_check.py, loaded from its file (benchmarks is no package): its
    markdown is the GPU table's, so the README and the check's own results.md agree."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("accelerator_check", CHECK_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["accelerator_check"] = module
    spec.loader.exec_module(module)
    return module


def fig_readme_performance(got: Callable[[str], dict[str, Any]]) -> str:
    m1, tiny, comp = got("bench:cpu-m1-target"), got("bench:cpu-tiny"), got("bench-compile")
    (r,) = _bench_rows(m1["rows"], shape="m1", teachers=0)
    plain = {row["teachers"]: row for row in _bench_rows(tiny["rows"], shape="tiny", dtype="float32")}
    ratios = _compile_ratios(comp["stdout"])
    cpu = _prose(
        f"**CPU** (2 cores; [records](docs/results.md#benchmarks)): paper M1's shape at {r['batch']} × {r['seq']} "
        f"trains at {_int(r['tokens_per_s'])} tokens/s ({100 * r['mfu']:.1f}% MFU), PyTorch eager at "
        f"{_int(r['torch_tokens_per_s'])}; distilling from 4 teachers costs "
        f"{plain[0]['tokens_per_s'] / plain[4]['tokens_per_s']:.2f}× a plain step (PyTorch eager "
        f"{plain[0]['torch_tokens_per_s'] / plain[4]['torch_tokens_per_s']:.2f}×). LOIRE compiles "
        f"{ratios['cache off']} GPT_L's time (cache off), and a warm rerun {ratios['LOIRE warm']} of a cold one "
        "([why](docs/performance.md#compile-time-one-program-per-stage)).")
    results = ACCELERATOR / "results.json"
    if not results.exists():
        gpu = _prose(
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
    gpu = _prose(f"**GPU**: measured {data['started'][:10]} on {device}{at} by `{' '.join(data['command'])}` "
                 f"(every part: `benchmarks/results/accelerator/`).{cut}")
    rows = []
    for r in records:
        vs = (f"{r['tokens_per_s'] / r['torch_compile_tokens_per_s']:.2f}×"
              if r.get("tokens_per_s") and r.get("torch_compile_tokens_per_s") else "–")
        teachers = f"{r['teachers']} teacher{'' if r['teachers'] == 1 else 's'}"
        rows.append((f"{r['label']}, {r['batch']} × {r['seq']}, {teachers}", check._rate(r),
                     check._rate(r, "torch_compile_") if r.get("torch_compile") else "–", vs,
                     check._f(r.get("compiled_peak_gib"), ".2f")))
    from loire_jax.analysis.tables import markdown_table

    table = markdown_table(("case", "loire_jax tokens/s (MFU)", "torch.compile (MFU)", "ratio", "compiled peak GiB"),
                           rows)
    return cpu + "\n" + gpu + "\n" + "\n".join(table) + "\n"


def _cut_cases(check: Any, records: list[dict[str, Any]]) -> str:
    """The sentence naming the step plan's cases a recorded check did not run (a short GPU
    slot runs a few), grouped by shape and batch; empty when it ran them all."""
    ran = {(r["shape"], r["batch"], r["seq"], r["teachers"]) for r in records if r.get("tokens_per_s")}
    missing: dict[tuple[str, int, int], list[int]] = {}
    for c in check.step_cases(check.REAL, chosen=False):
        if (c["shape"], c["batch"], c["seq"], c["teachers"]) not in ran:
            missing.setdefault((c["label"], c["batch"], c["seq"]), []).append(c["teachers"])
    if not missing:
        return ""
    return " Not run (cut to fit its time): " + "; ".join(
        f"{label} {b} × {s} with {' and '.join(map(str, t))} teacher{'s' if t != [1] else ''}"
        for (label, b, s), t in missing.items()) + "."


FIGURES: dict[str, Callable[[Callable[[str], dict[str, Any]]], str]] = {
    "default-run-log": fig_default_run_log,
    "default-run-report": fig_default_run_report,
    "default-run-wall": fig_default_run_wall,
    "grow-demo": fig_grow_demo,
    "gpt2": fig_gpt2,
    "bench-throughput": fig_bench_throughput,
    "bench-memory": fig_bench_memory,
    "flops-xla": fig_flops_xla,
    "hf-import": fig_hf_import,
    "growth-f64": fig_growth_f64,
    "data-prepare": fig_data_prepare,
    "bench-data": fig_bench_data,
    "bench-compile": fig_bench_compile,
    "readme-performance": fig_readme_performance,
    "bert-tiny-report": fig_bert_tiny_report,
    "bench-encoder": fig_bench_encoder,
    "paper-mini": fig_paper_mini,
    "paper-mini-verdicts": fig_paper_mini_verdicts,
}


def render(name: str) -> str:
    """The text between NAME's markers, from the records alone."""
    cache: dict[str, dict[str, Any]] = {}

    def got(rec: str) -> dict[str, Any]:
        if rec not in cache:
            cache[rec] = load(rec)
        return cache[rec]

    return "\n" + FIGURES[name](got) + "\n"


def quoted(text: str) -> dict[str, str]:
    """NAME -> the text between its markers in one document."""
    return {m.group(1): m.group(2) for m in MARKER.finditer(text)}


def problems() -> list[str]:
    """Every way the docs and the records disagree, one line each (none: all figures hold)."""
    out = []
    seen = set()
    for doc in DOCS:
        if not doc.exists():
            continue
        for name, text in quoted(doc.read_text()).items():
            seen.add(name)
            if name not in FIGURES:
                out.append(f"{doc.relative_to(ROOT)}: figures:{name} is no figure this script renders "
                           f"({', '.join(FIGURES)})")
            elif text != render(name):
                out.append(f"{doc.relative_to(ROOT)}: figures:{name} differs from its record; "
                           "python tools/docs_figures.py --write renders it")
    out += [f"figures:{name} is quoted nowhere in {', '.join(str(d.relative_to(ROOT)) for d in DOCS)}"
            for name in FIGURES if name not in seen]
    first, warm = load("default-run-first"), load("default-run")
    a, b = run_figures(first["report"], first["stdout"]), run_figures(warm["report"], warm["stdout"])
    out += [f"the two recorded default runs differ in {key}: {a[key]} vs {b[key]}" for key in a if a[key] != b[key]]
    return out


def write() -> list[str]:
    """Re-render every marked figure in place; returns the documents changed."""
    changed = []
    for doc in DOCS:
        if not doc.exists():
            continue
        text = doc.read_text()
        new = MARKER.sub(lambda m: f"<!-- figures:{m.group(1)} -->{render(m.group(1))}<!-- /figures -->"
                         if m.group(1) in FIGURES else m.group(0), text)
        if new != text:
            doc.write_text(new)
            changed.append(str(doc.relative_to(ROOT)))
    return changed


_WHOLE_STDOUT = ("data-prepare", "hf-import", "flops-xla", "growth-f64")


def reproduce(name: str) -> list[str]:
    """Rerun NAME's command in a temporary workdir and compare its deterministic figures with the
    record's; returns the differences (the record is left as it is)."""
    spec = RECORDINGS[name]
    with tempfile.TemporaryDirectory(prefix=f"loire-{name}-") as tmp:
        workdir = Path(tmp) / "run" if spec.workdir is None else ROOT / spec.workdir
        if spec.workdir is not None and workdir.exists():
            return [f"{workdir} exists; move it away to rerun {name} (a rerun there would resume, not run)"]
        command = [part.format(workdir=workdir) for part in spec.command]
        done = subprocess.run([sys.executable, *command[1:]], cwd=ROOT, capture_output=True)
        if done.returncode != 0:
            return [f"{' '.join(command)} exited {done.returncode}: {done.stderr.decode(errors='replace')[-500:]}"]
        stdout, saved = terminal_text(done.stdout.decode(errors="replace")), load(name)
        if name == "grow-demo":
            got, want = demo_rows(stdout), demo_rows(saved["stdout"])
            return [] if got == want else [f"growth demo rows {got} != recorded {want}"]
        if name in _WHOLE_STDOUT:  # deterministic output on the same platform: all of it
            return [] if stdout == saved["stdout"] else [f"output {stdout!r} != recorded {saved['stdout']!r}"]
        if not spec.keep:
            return [f"{name} records timings only; nothing deterministic to compare"]
        (report,) = json.loads((workdir / "report" / "report.json").read_text())["runs"]
    got, want = run_figures(report, stdout), run_figures(saved["report"], saved["stdout"])
    return [f"{key}: {got[key]} != recorded {want[key]}" for key in want if got[key] != want[key]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--check", action="store_true", help="exit 1 if a quoted figure differs from its record")
    group.add_argument("--write", action="store_true", help="rewrite the quoted figures from the records")
    group.add_argument("--record", choices=sorted(RECORDINGS), help="rerun a recorded command and record it anew")
    group.add_argument("--reproduce", choices=sorted(RECORDINGS),
                       help="rerun a recorded command and compare its deterministic figures with the record")
    group.add_argument("--measure", choices=sorted(MEASURES), help="print a measurement a record runs")
    args = parser.parse_args(argv)
    if args.measure:
        MEASURES[args.measure]()
        return 0
    try:
        if args.record:
            print(f"recorded: {record(args.record)}")
            return 0
        if args.reproduce:
            diffs = reproduce(args.reproduce)
            for line in diffs:
                print(f"differs: {line}", file=sys.stderr)
            print("reproduced: the deterministic figures equal the record's" if not diffs else "", end="")
            return 1 if diffs else 0
        if args.write:
            changed = write()
            print(f"rewrote figures in {', '.join(changed)}" if changed else "every figure was current")
        found = problems()
    except (FileNotFoundError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for line in found:
        print(f"error: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
