"""The accelerator check's parts, each one's measurement: ``PART_FUNCS`` maps a part's name
to the function that runs it inside its allowance and returns its figures (its records go
into the check's results as they come). A part that cannot run here raises ``Skipped``; one
that fails or runs out of time, ``PartError``. The ``variants`` part's own code is in
variants.py.

Loaded from its file by accelerator_check.py after its neighbours (benchmarks is no package:
the imports below find the scripts it loaded first).
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import bench_step as bench
import variants
import yaml
from accelerator_plan import (
    PART_SECONDS,
    TOY,
    case_seconds,
    engine_config,
    paper_config,
    stage_shapes,
    step_cases,
    suite_config,
    variants_figures,
)
from accelerator_runner import Budget, Check, PartError, Skipped

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "data" / "fixtures"  # the test suite's offline corpus: the dry run's data


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
def step_part(check: Check, budget: Budget) -> dict[str, Any]:
    """The step table: every case's JAX step in one child process, then their PyTorch runs in
    another (``bench.measure``): a child's start is paid once, not per case. The device's
    peak counter is then the process's, so the cases' peaks are the compiled ones."""
    cases = step_cases(check.scale)
    if not check.torch:
        for case in cases:
            case.update(torch=False, torch_compile=False, torch_skipped="torch is not importable here")
    part = check.results.part("step")
    part["records"].extend(bench.measure(cases, budget.left(), check.env()))
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


# --------------------------------------------------------------------------- part: variants (variants.py)
def variants_part(check: Check, budget: Budget) -> dict[str, Any]:
    """The step table's first case (M5, 32 x 1024, no teachers) as today's defaults run it,
    against each candidate execution path and their best combination (variants.py). The
    defaults' row is the step part's record of that case when it ran (with its torch.compile)."""
    base = next(c for c in step_cases(check.scale, chosen=False) if c["teachers"] == 0)
    base = dict(base, torch=False, torch_compile=check.torch,
                **({} if check.torch else {"torch_skipped": "torch is not importable here"}))
    same = ("shape", "batch", "seq", "teachers", "dtype")
    reused = next((r for r in check.results.part("step")["records"] if r.get("tokens_per_s")
                   and all(r.get(k) == base[k] for k in same)), None)
    return variants.run(check, budget, base, bench._configs(base)[0].layers, bench.measure, PartError,
                        variants_figures(check.scale), reused)


# --------------------------------------------------------------------------- every part, by name
PART_FUNCS: dict[str, Callable[[Check, Budget], dict[str, Any]]] = {
    "data": data_part, "step": step_part, "variants": variants_part, "growth": growth_part, "engine": engine_part, "gpt_paper": gpt_paper_part,
    "gptl_vs_loire": gptl_vs_loire_part}

