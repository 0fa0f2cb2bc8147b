"""``benchmarks/accelerator_check.py``: one command for every accelerator figure (issue 26).

The dry run goes through the whole plan at toy shapes on the CPU and must leave every part's
figures, finite, in results.json and the tables in results.md. Bad arguments are one line
and touch nothing; the real plan's configs (which only a GPU runs) load at the paper's
shapes; a child that outlives its allowance is killed with its own children; a failing
part is recorded and the plan goes on, the results rewritten after every part."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from runs import own_devices_env

from loire_jax.cli.scripts import script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "accelerator_check.py"


@pytest.fixture(scope="module")
def check():
    return script(SCRIPT)


@pytest.fixture(scope="module")
def reference():
    return script(SCRIPT.with_name("torch_reference.py"))


def one_line(capsys, main, argv: list[str]) -> str:
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


# --------------------------------------------------------------------------- arguments
def test_an_out_that_is_a_file_is_refused_and_left_alone(check, capsys, tmp_path):
    target = tmp_path / "results"
    target.write_text("mine")
    assert "is a file" in one_line(capsys, check.main, ["--out", str(target), "--dry-run"])
    assert target.read_text() == "mine"


def test_a_non_empty_directory_no_check_made_is_refused_and_left_alone(check, capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    assert "non-empty directory" in one_line(capsys, check.main, ["--out", str(tmp_path), "--dry-run"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_an_earlier_checks_directory_is_taken_again(check, tmp_path):
    first = check.open_out(str(tmp_path / "out"))
    (first / "results.json").write_text("{}")
    assert check.open_out(str(tmp_path / "out")) == first


@pytest.mark.parametrize("argv,says", [
    (["--budget-min", "0"], "--budget-min must be a positive number"),
    (["--budget-min", "-3"], "--budget-min must be a positive number"),
    (["--budget-min", "nan"], "--budget-min must be a positive number"),
    (["--parts", "step,bogus"], "--parts takes comma-separated names"),
    (["--parts", "step,"], "--parts takes comma-separated names"),
])
def test_bad_arguments_are_one_line_and_create_nothing(check, capsys, tmp_path, argv, says):
    out = tmp_path / "out"
    assert says in one_line(capsys, check.main, ["--out", str(out), *argv])
    assert not out.exists()


@pytest.mark.parametrize("argv,says", [
    (["--parts", "growth,engine", "--cases", "m5-32x1024-t0"],
     "--cases chooses within the step part, which --parts growth,engine does not run"),
    (["--parts", "step", "--variants", "unrolled"], "--variants chooses within the variants part, which --parts step "
                                                    "does not run"),
    (["--parts", "data", "--cases", "bogus", "--variants", "bogus"], "--cases chooses within the step part"),
])
def test_a_flag_that_selects_nothing_in_the_parts_chosen_is_refused(check, capsys, tmp_path, argv, says):
    """``--cases`` and ``--variants`` choose within one part each; without that part they were
    silently ignored (a short slot then spent on what was not asked). --list: nothing runs
    either way."""
    out = tmp_path / "out"
    line = one_line(capsys, check.main, ["--out", str(out), "--list", *argv])
    assert says in line and line.endswith(f"or drop --{line.split()[1][2:]}"), line
    assert not out.exists()


# --------------------------------------------------------------------------- the accelerator's plan
PAPER_SHAPES = [(384, 1024, 6, 6), (768, 1024, 6, 6), (768, 2048, 6, 6), (768, 2048, 12, 6), (768, 2048, 12, 12)]


def shapes(run) -> list[tuple[int, int, int, int]]:
    from loire_jax.config.schedule import stage_models

    return [(m.hidden, m.ffn, m.heads, m.layers) for m in stage_models(run)]


def test_the_accelerator_plans_runs_are_valid_configs_at_the_papers_shapes(check, tmp_path):
    """What only the GPU runs is checked here: every config the real plan writes loads,
    at the issue's shapes and batches."""
    import yaml

    from loire_jax import load_run_config
    from loire_jax.experiments import suite as suites

    data = str(ROOT / "configs" / "domains" / "default.yaml")
    paper = check.paper_config(check.REAL, data, check.REAL.paper_steps)
    (tmp_path / "paper.yaml").write_text(yaml.safe_dump(paper))
    run = load_run_config(tmp_path / "paper.yaml")
    assert (run.batch_size, run.seq_len, run.precision, run.model.vocab_size) == (64, 1024, "bf16", 50257)
    assert shapes(run) == PAPER_SHAPES and all(st.steps == check.REAL.paper_steps for st in run.stages)

    engine, case = check.engine_config(check.REAL, data)
    (tmp_path / "engine.yaml").write_text(yaml.safe_dump(engine))
    run = load_run_config(tmp_path / "engine.yaml")
    assert shapes(run) == PAPER_SHAPES[-1:] and (run.batch_size, run.seq_len, run.precision) == (32, 1024, "bf16")
    assert (case["shape"], case["batch"], case["seq"], case["teachers"]) == ("m5", 32, 1024, 0)

    base = check.suite_config(check.REAL, data)
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    compile_bench = check._script("bench_compile")
    compile_bench.write_suite(tmp_path, tmp_path / "base.yaml", [])
    runs = suites.main_runs(suites.load_suite(str(tmp_path / "suite.yaml")), ())
    assert sorted(r.system for r in runs) == ["GPT_L", "LOIRE"]
    for r in runs:
        assert (r.config.batch_size, r.config.seq_len, len(r.config.stages)) == (32, 1024, 5)
    assert shapes(next(r.config for r in runs if r.system == "LOIRE")) == PAPER_SHAPES

    table = [(c["shape"], c["batch"], c["seq"], c["teachers"], c["dtype"], c["torch"], c["torch_compile"], c["default"])
             for c in check.step_cases(check.REAL, chosen=False)]
    assert table == [("m5", 32, 1024, 0, "bfloat16", False, True, True), ("m5", 32, 1024, 1, "bfloat16", False, True, True),
                     ("1b", 8, 1024, 0, "bfloat16", False, True, True), ("m5", 32, 1024, 4, "bfloat16", False, False, False),
                     ("1b", 8, 1024, 1, "bfloat16", False, False, False), ("1b", 8, 1024, 4, "bfloat16", False, False, False),
                     ("m5", 64, 1024, 4, "bfloat16", False, False, False)]
    # every case runs today's defaults: each auto as the trainer resolves it
    assert {(c["remat"], c["loss_logits"], c["fused"], c["scan_unroll"]) for c in check.step_cases(check.REAL)} == {
        ("auto", "auto", "auto", "auto")}


def test_list_prints_the_plan_and_creates_nothing(check, capsys, tmp_path):
    assert check.main(["--out", str(tmp_path / "out"), "--list", "--budget-min", "14"]) == 0
    printed = capsys.readouterr().out
    assert "1.1B final stage (2048, 6144, 32, 24) V50257 8x1024 bfloat16 teachers 0; torch compile" in printed
    assert "(384, 1024, 6, 6) -> (768, 1024, 6, 6)" in printed and not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- time and failures
@pytest.mark.slow  # it starts several processes
def test_a_child_past_its_allowance_is_killed_with_its_own_children(check, tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    code = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    start = time.monotonic()
    child = check.bench.run_child([sys.executable, "-c", code], timeout=3)
    assert child.timed_out and time.monotonic() - start < 20
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # reaped by init shortly after the kill
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the grandchild {grandchild} outlived the allowance")


@pytest.mark.slow  # it starts several processes
def test_a_failing_part_is_recorded_and_the_plan_goes_on(check, tmp_path, monkeypatch):
    out = check.open_out(str(tmp_path / "out"))
    (out / "run" / "logs").mkdir(parents=True)
    seen = []

    def fails(chk, budget):
        seen.append("growth")
        written = {p["name"]: p for p in json.loads((out / "results.json").read_text())["parts"]}
        assert written["data"]["status"] == "ok" and written["growth"]["status"] == "running"  # as it goes
        chk.run("growth", [sys.executable, "-c", "import sys; sys.exit('RuntimeError: the demo broke')"], budget.left())

    def slow(chk, budget):
        seen.append("engine")
        chk.run("engine", [sys.executable, "-c", "import time; time.sleep(60)"], 1.5)

    monkeypatch.setitem(check.PART_FUNCS, "data", lambda chk, budget: {"prepared": {}})
    monkeypatch.setitem(check.PART_FUNCS, "growth", fails)
    monkeypatch.setitem(check.PART_FUNCS, "engine", slow)
    monkeypatch.setitem(check.PART_FUNCS, "gpt_paper", lambda chk, budget: seen.append("gpt_paper") or {})
    head = {"command": ["python", "x"], "started": "now", "dry_run": True, "budget_min": 1, "versions": {}}
    chk = check.Check(out, out / "run", check.DRY, check.Budget(60), check.Results(out, head), torch=False)
    assert check.run_plan(chk, ["data", "growth", "engine", "gpt_paper"]) == 1
    assert seen == ["growth", "engine", "gpt_paper"]
    parts = {p["name"]: p for p in json.loads((out / "results.json").read_text())["parts"]}
    assert parts["data"]["status"] == "ok" and parts["gpt_paper"]["status"] == "ok"
    assert parts["growth"]["status"] == "failed" and "RuntimeError: the demo broke" in parts["growth"]["error"]
    assert parts["engine"]["status"] == "out of time"
    assert parts["step"]["status"] == "not selected"
    md = (out / "results.md").read_text()
    assert "| growth | failed |" in md and "| engine | out of time |" in md


# --------------------------------------------------------------------------- the PyTorch reference
def finite(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def torch_case(mode: str, backend: str = "inductor") -> dict:
    small = dict(vocab_size=64, max_seq_len=16, hidden=16, ffn=32, heads=2, head_dim=8, layers=2)
    return {"student": small, "teachers": [dict(small, layers=1)], "batch": 2, "seq": 8, "dtype": "float32",
            "steps": 2, "repeats": 1, "mode": mode, "backend": backend}


def test_the_torch_reference_says_torch_is_missing_in_its_record(reference, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    record = reference.run_case(torch_case("eager"))
    assert record["error"].startswith("torch is not importable") and "tokens_per_s" not in record


@pytest.mark.parametrize("mode,backend", [("eager", "inductor"), ("compile", "aot_eager")])
def test_the_torch_reference_times_both_modes_with_a_teacher(reference, mode, backend):
    pytest.importorskip("torch", reason="torch is not a dependency: the PyTorch reference is timed only where it is "
                                        "installed (a GPU image has it; the test without torch is above)")
    record = reference.run_case(torch_case(mode, backend))
    assert "error" not in record, record
    assert record["mode"] == mode and finite(record["tokens_per_s"], record["warmup_s"], record["loss"])


# --------------------------------------------------------------------------- the dry run


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("accelerator") / "out"
    result = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)], cwd=ROOT, env=own_devices_env(),
                            capture_output=True, text=True, timeout=600)
    return out, result


# In the "engine" group, one after another with the two-process tests, as tests/test_experiment.py
# is: the dry run starts a suite subprocess too, and on a 2-core machine beside them it overloads it.
ENGINE = pytest.mark.xdist_group("engine")


@pytest.mark.slow
@ENGINE
def test_the_dry_run_measures_every_part(check, dry_run):
    out, result = dry_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    parts = {p["name"]: p for p in data["parts"]}
    assert list(parts) == list(check.PARTS)
    assert {n: p["status"] for n, p in parts.items()} == {n: "ok" for n in check.PARTS}, parts
    assert data["dry_run"] and data["device"]["platform"] == "cpu" and data["versions"]["jax"]
    assert data["command"][-3:] == ["--dry-run", "--out", str(out)] and data["seconds"] > 0

    step = parts["step"]["records"]
    assert len(step) == len(check.step_cases(check.DRY))
    for r in step:
        assert "error" not in r, r
        assert finite(r["tokens_per_s"], r["compiled_peak_gib"], r["compile_s"]) and r["tokens_per_s"] > 0
        assert r["mfu"] is None or 0 < r["mfu"] <= 1, r  # None: above a CPU peak measured too low (issue 43)
    kd = parts["step"]["figures"]["kd_cost"]
    assert kd and all(finite(k["ratio"]["1"]) for k in kd[:1])  # the plan's rows: 0 and 1 teacher
    assert {r["remat_run"] for r in step} == {"none"} and all("remat_by_memory" not in r for r in step)  # a CPU
    memory = parts["step"]["figures"]["memory_1b"]
    assert memory and all(finite(m["compiled_peak_gib"]) for m in memory)

    growth = parts["growth"]
    assert [r["operator"] for r in growth["records"]] == ["-", "hidden", "ffn", "heads", "layers"]
    assert finite(growth["figures"]["max_abs_dlogits"]) and growth["figures"]["preserved"]

    engine = parts["engine"]["figures"]
    assert finite(engine["engine_tokens_per_s"], engine["bench_tokens_per_s"], engine["ratio"])

    paper = parts["gpt_paper"]
    assert paper["figures"]["batch"] == 64 and paper["figures"]["stages"] == 2
    trained = [r for r in paper["records"] if r["phase"] == "train"]
    assert {r["stage"] for r in trained} == {1, 2} and all(finite(r["tokens_per_s"]) for r in trained)
    assert all(r["mfu"] is None or 0 < r["mfu"] <= 1 for r in trained), trained
    for stage in (1, 2):  # one training program a stage, compiled before its first phase and shared by the rest
        rows = [r for r in paper["records"] if r["stage"] == stage]
        assert finite(rows[0]["compile_s"], rows[0]["compiled_peak_gib"]), rows
        assert all(r["compile_s"] is None for r in rows[1:]), rows

    suite = parts["gptl_vs_loire"]
    split = [r for r in suite["records"] if "breakdown" in r]
    assert sorted(r["system"] for r in split) == ["GPT_L", "LOIRE"]
    for r in split:
        assert finite(r["flops"], *r["breakdown"].values()) and r["breakdown"]["compile"] > 0
    # every pass of both systems: one training step and one evaluation per stage (two stages here)
    passes = [(r["system"], r["pass"], r["programs"]) for r in suite["records"] if "pass" in r]
    assert sorted(passes) == [(s, p, 4) for s in ("GPT_L", "LOIRE") for p in ("cold", "warm")]
    fig = suite["figures"]
    assert 0 < fig["flops_ratio"] < 1  # LOIRE's first stage is the smaller model
    assert finite(fig["steps_ratio"], fig["wall_ratio"], fig["compile"]["loire_over_gpt_l_cold"],
                  fig["compile"]["loire_over_gpt_l_warm"], fig["compile"]["LOIRE_warm_over_cold"],
                  fig["compile"]["GPT_L_warm_over_cold"])


@pytest.mark.slow
@ENGINE
def test_the_dry_runs_markdown_has_every_table(dry_run):
    out, _ = dry_run
    md = (out / "results.md").read_text()
    for heading in ("## Parts", "## Train step", "### KD cost", "### 1.1B memory", "## Growth demo",
                    "## Engine vs benchmark", "## gpt_paper.yaml", "## GPT_L vs LOIRE"):
        assert heading in md, heading
    assert "| shape (h, f, heads, L), V | batch × seq | teachers | loire_jax tokens/s (MFU) |" in md
    assert "error" not in md and "–% " not in md, md
    assert "LOIRE / GPT_L: FLOPs" in md and "| LOIRE | warm cache | 4 |" in md


@pytest.mark.slow
@ENGINE
def test_the_readme_renders_a_recorded_check_s_step_table_with_its_date_device_and_command(dry_run, tmp_path,
                                                                                         monkeypatch):
    """README's Performance section shows the GPU table of the check copied to
    benchmarks/results/accelerator: here the dry run's results, relabelled as a real check's
    (the renderer refuses a dry run's, whose toy figures are no GPU's)."""
    figures = script(ROOT / "tools" / "docs_figures.py")
    out, _ = dry_run
    data = json.loads((out / "results.json").read_text())
    monkeypatch.setattr(figures.accelerator, "ACCELERATOR", tmp_path)
    (tmp_path / "results.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="dry run"):
        figures.render("readme-performance")
    data["dry_run"] = False
    (tmp_path / "results.json").write_text(json.dumps(data))
    text = figures.render("readme-performance")
    gpu = text[text.index("**GPU**"):]
    prose = " ".join(gpu.split())  # the paragraph is wrapped
    assert data["started"][:10] in prose and data["device"]["kind"] in prose and " ".join(data["command"]) in prose
    step = next(p for p in data["parts"] if p["name"] == "step")
    rows = [ln for ln in gpu.splitlines() if ln.startswith("| toy")]  # the step table's
    assert len(rows) == len(step["records"]) and all(f"{round(r['tokens_per_s']):,}" in row
                                                       for r, row in zip(step["records"], rows))


# --------------------------------------------------------------------------- issue 41: variants, cases, header
def test_cases_are_chosen_by_the_names_list_prints(check, capsys, tmp_path):
    assert check.main(["--out", str(tmp_path / "out"), "--list", "--parts", "step",
                       "--cases", "m5-32x1024-t0,1b-8x1024-t0"]) == 0
    printed = capsys.readouterr().out
    assert "m5-32x1024-t0: paper M5" in printed and "1b-8x1024-t0: 1.1B final stage" in printed
    assert "m5-32x1024-t1" not in printed and not (tmp_path / "out").exists()
    says = one_line(capsys, check.main, ["--out", str(tmp_path / "out"), "--cases", "m5-32x1024-t0,m5-bogus"])
    assert "--cases takes comma-separated step cases from ['m5-32x1024-t0'" in says and not (tmp_path / "out").exists()
    names = [c["name"] for c in check.step_cases(check.DRY)]
    assert len(set(names)) == len(names)  # every case of either plan has a name of its own


def test_the_step_and_variants_parts_fit_nine_minutes_of_an_h100_by_the_recorded_figures(check, capsys, tmp_path):
    """``--parts step,variants``: today's defaults beside torch.compile at M5 (0, 1 teacher) and
    the 1.1B stage, then the candidates at M5 and their best combination, within 9 minutes by
    the H100 follow-up's figures (the defaults' row reused from the step part)."""
    parts = ["step", "variants"]
    seconds = sum(check.part_seconds(p, check.REAL, parts) for p in parts)
    assert 5 * 60 < seconds <= 9 * 60, seconds
    alone = check.part_seconds("variants", check.REAL, ["variants"])
    assert alone > check.part_seconds("variants", check.REAL, parts)  # alone, it times the defaults and torch.compile
    figures, source = check.check_plan.recorded_figures()
    assert "H100 follow-up of 2026-11-27" in source and figures["m5"]["compile_s"] > 30
    assert check.main(["--out", str(tmp_path / "out"), "--list", "--parts", "step,variants"]) == 0
    printed = capsys.readouterr().out
    assert f"estimate {seconds / 60:.1f} min" in printed and "the step part's case" in printed
    assert [c["name"] for c in check.step_cases(check.REAL)] == ["m5-32x1024-t0", "m5-32x1024-t1", "1b-8x1024-t0"]
    assert all(c["torch_compile"] for c in check.step_cases(check.REAL))


def _variant(name, rate, **opts):
    return {"variant": name, "tokens_per_s": rate, "options": opts, "loss": 1.0}


def test_the_best_combination_takes_what_beat_the_defaults(check):
    v = check.variants
    records = [_variant(v.PLAIN, 100.0), _variant("a", 120.0, remat="dots_names"),
               _variant("b", 110.0, xla_gpu_flags="scheduler"), _variant("c", 115.0, xla_gpu_flags="cudnn_norm"),
               _variant("d", 100.5, weight_cast="step")]
    assert v.combined_options(records) == {"remat": "dots_names", "xla_gpu_flags": "cudnn_norm"}
    slower = [_variant(v.PLAIN, 100.0), _variant("a", 90.0, remat="dots_names"), _variant("b", 95.0, fused="all")]
    assert v.combined_options(slower) == {}  # none faster: the defaults are the best combination


@pytest.mark.parametrize("rates, timed_again", [((101.5, 99.0), False), ((99.0, 98.0), False), ((102.0, 103.0), True)])
def test_the_combination_is_timed_only_when_it_is_no_row_already(check, tmp_path, rates, timed_again):
    """One winner: the combination is that row; none: the defaults' row; two: timed. The
    defaults' row is the step part's record when given; candidates with XLA flags run in a
    child of their own, the fused kernels last in theirs."""
    v = check.variants
    head = {"command": ["python", "x"], "started": "now", "dry_run": False, "budget_min": 9, "versions": {}}
    chk = types.SimpleNamespace(results=check.Results(tmp_path, head), env=lambda: {},
                                scale=dataclasses.replace(check.REAL, variants="fused kernels,float32 logits,"
                                                                                "xla scheduler"))
    rate = {"fused kernels": rates[0], "float32 logits": rates[1], "xla scheduler": 90.0}
    groups = []

    def measure(cases, timeout, env):
        groups.append([c["variant"] for c in cases])
        return [dict(c, tokens_per_s=rate.get(c["variant"], 200.0), loss=1.0) for c in cases]

    base = {"shape": "m5", "batch": 32, "seq": 1024, "teachers": 0, "dtype": "bfloat16", "torch_compile": True}
    step_record = dict(base, tokens_per_s=100.0, loss=1.0, torch_compile_tokens_per_s=90.0)
    fig = v.run(chk, check.Budget(600), base, 12, measure, RuntimeError,
                {"compile_s": 40.0, "step_s": 1.0, "process_s": 8.0, "torch_s": 50.0}, step_record)
    names = [r["variant"] for r in chk.results.part("variants")["records"]]
    assert names == [v.PLAIN, "fused kernels", "float32 logits", "xla scheduler", v.COMBINED]
    assert groups[:2] == [["float32 logits", "fused kernels"], ["xla scheduler"]]
    assert (len(groups) == 3) == timed_again
    combined = chk.results.part("variants")["records"][-1]
    assert combined.get("same_as") == (None if timed_again else "fused kernels" if rates[0] > 101 else v.PLAIN)
    assert fig["vs_torch_compile"][v.PLAIN] == pytest.approx(100 / 90)


def test_the_results_name_the_device_and_commit_without_the_step_part(check, tmp_path):
    head = {"command": ["python", "x"], "started": "now", "dry_run": False, "budget_min": 1, "versions": {},
            "commit": "abc123", "probed": {"devices": "1 gpu device(s)", "kind": "NVIDIA H100 80GB HBM3",
                                           "platform": "gpu", "peak_flops": 989e12, "peak_source": "published"}}
    results = check.Results(tmp_path, head)
    results.part("gpt_paper")
    results.write()
    md = (tmp_path / "results.md").read_text()
    assert "- device: NVIDIA H100 80GB HBM3 (1 gpu device(s))" in md and "commit abc123" in md


def test_the_probe_names_an_accelerator_and_its_published_peak(check, monkeypatch):
    """The header's device comes from a child's ``describe``; an H100 there (an H100 check of
    2026-11-27 said "unknown" when the probe failed on a GPU's peak). A CPU's peak is the one
    given by $LOIRE_CPU_PEAK_FLOPS, else measured per case (none in the header)."""
    gpu = types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H100 80GB HBM3")
    got = check.variants.describe([gpu, gpu])
    assert got["devices"] == "2 gpu device(s)" and got["kind"] == "NVIDIA H100 80GB HBM3"
    assert got["peak_flops"] == 2 * 989e12 and "H100" in got["peak_source"]
    cpu = types.SimpleNamespace(platform="cpu", device_kind="cpu")
    monkeypatch.delenv("LOIRE_CPU_PEAK_FLOPS", raising=False)  # a parallel test session hands its workers one
    assert check.variants.describe([cpu])["peak_flops"] is None
    monkeypatch.setenv("LOIRE_CPU_PEAK_FLOPS", "2.5e11")
    assert check.variants.describe([cpu])["peak_flops"] == 2.5e11


def test_the_results_name_the_device_from_the_variants_part_when_the_probe_failed(check, tmp_path):
    head = {"command": ["python", "x"], "started": "now", "dry_run": False, "budget_min": 1, "versions": {},
            "commit": "abc123", "probed": {"error": "ValueError: too many values to unpack"}}
    results = check.Results(tmp_path, head)
    results.part("variants")["records"].append({"variant": "plain", "device": "1 gpu device(s)",
                                                "device_kind": "NVIDIA H100 80GB HBM3", "platform": "gpu",
                                                "peak_flops": 989e12, "peak_source": "published H100 bf16 x 1"})
    results.write()
    md = (tmp_path / "results.md").read_text()
    assert "- device: NVIDIA H100 80GB HBM3 (1 gpu device(s)); MFU peak: 989.0 TFLOP/s" in md
    results.parts.clear()
    results.write()
    assert "- device: unknown (-) (the probe: ValueError: too many values to unpack)" in (tmp_path / "results.md").read_text()


def test_variants_selects_by_name_and_always_keeps_the_defaults(check, capsys, tmp_path):
    v = check.variants
    assert v.pick(None) == tuple(n for n, _ in v.VARIANTS[:v.DEFAULT_COUNT])
    assert v.pick("all") == tuple(n for n, _ in v.VARIANTS)
    assert v.pick("xla scheduler, remat dots") == (v.PLAIN, "remat dots", "xla scheduler")
    fig = {"compile_s": 40.0, "step_s": 1.0, "process_s": 8.0, "torch_s": 50.0}
    each = v.seconds_each(False, fig, v.pick("remat dots,xla scheduler"))
    assert each == {v.PLAIN: 99.0, "remat dots": 41.0, "xla scheduler": 49.0, v.COMBINED: 41.0}  # a child each flag set
    assert v.seconds_each(False, fig, v.pick("remat dots"), reuse_defaults=True)[v.PLAIN] == 0
    says = one_line(capsys, check.main, ["--out", str(tmp_path / "out"), "--parts", "variants", "--variants", "bogus"])
    assert "--variants takes comma-separated names from ['defaults'" in says and not (tmp_path / "out").exists()


def test_the_unroll_sweep_runs_bench_steps_own_cases_at_every_setting_it_names():
    sweep = script(ROOT / "benchmarks" / "unroll_sweep.py")
    for dry in (True, False):
        cases = sweep.cases(dry)
        assert [c["argv"][-len(extra):] for c, (_, extra) in zip(cases, sweep.CASES)] == [e for _, e in sweep.CASES]
        assert [c["shape"] for c in cases] == (["tiny"] * 6 if dry else [s for s, _ in sweep.CASES])
        assert [c["scan_unroll"] for c in cases] == [12, 4, 12, 12, 24, 1]


def test_the_commit_is_the_checkouts_or_unknown(check, tmp_path):
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", check.variants.commit())
    assert check.variants.commit(tmp_path) == "unknown"


@pytest.mark.slow
@ENGINE
def test_the_dry_runs_variants_part_times_every_candidate_and_the_combination(check, dry_run):
    """The variants part of the whole dry run (the same part ``--parts variants`` runs alone: a
    second dry run for it cost the slow tier a minute on two cores)."""
    out, result = dry_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads((out / "results.json").read_text())
    assert data["device"]["platform"] == "cpu" and data["commit"] != ""
    part = next(p for p in data["parts"] if p["name"] == "variants")
    names = [r["variant"] for r in part["records"]]
    assert names == list(check.variants.pick(None)) + [check.variants.COMBINED]
    assert part["records"][0]["reused"] == "the step part's case"  # the defaults: the step table's case
    for r in part["records"]:
        assert "error" not in r, r
        assert finite(r["tokens_per_s"], r["mfu"], r["compile_s"], r["compiled_peak_gib"], r["loss"])
    ran = {r["variant"]: r for r in part["records"]}
    assert ran["fused kernels"]["fused_run"] == "all" and ran["float32 logits"]["loss_logits_run"] == "float32"
    assert ran["remat dots"]["remat_run"] == "dots" and ran["loss blocks 4096"]["loss_chunk_run"] == 4096
    assert max(part["figures"]["loss_gap"].values()) < 1e-4  # the same training, whichever way it ran
    md = (out / "results.md").read_text()
    assert "## Execution variants" in md and "| best combination |" in md and "- device: cpu" in md


def test_bench_step_takes_each_execution_option_and_refuses_a_bad_one(check):
    base = ["--shapes", "toy", "--dtypes", "bfloat16"]
    (case,) = check.bench.cases_of(base + ["--scan-unroll", "2", "--weight-cast", "step", "--remat", "dots_names",
                                           "--xla-gpu-flags", "cudnn_norm"])
    student, _ = check.bench._configs(case)
    assert (student.scan_unroll, student.weight_cast, student.remat, case["xla_gpu_flags"]) == (
        2, "step", "dots_names", "cudnn_norm")
    for flag, value, says in (("--scan-unroll", "0", "scan_unroll must be auto or a positive integer"),
                              ("--weight-cast", "once", "weight_cast must be one of"),
                              ("--xla-gpu-flags", "fast", "xla_gpu_flags must be one of")):
        with pytest.raises(ValueError, match=says):
            check.bench.cases_of(base + [flag, value])


def test_the_step_profile_sums_device_kernels_by_kind_and_falls_back_to_the_host_s_xla_ops():
    prof = script(SCRIPT.with_name("step_profile.py"))
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
            {"ph": "M", "name": "thread_name", "pid": 2, "tid": 7, "args": {"name": "tf_XLAPjRtCpuClient/1"}}]
    kernels = [("nvjet_sm90_tst_128x160", 0, 300), ("cudnn_generated_fort_native_sdpa_flash_bprop", 300, 200),
               ("loop_convert_fusion", 500, 100), ("loop_convert_fusion", 600, 100), ("memcpy128", 700, 50)]
    events = meta + [{"ph": "X", "pid": 1, "tid": 3, "name": n, "ts": t, "dur": d} for n, t, d in kernels]
    events.append({"ph": "X", "pid": 2, "tid": 7, "name": "host_only_op", "ts": 0, "dur": 9999})
    got = prof.summarize({"traceEvents": events}, steps=2)
    assert got["where"] == "device kernels" and got["span_ms"] == 0.375  # 750 us over 2 steps
    assert got["kinds_ms"] == {"matmul": 0.15, "attention": 0.1, "copies": 0.025, "other": 0.1}
    assert got["top"][0] == ["nvjet_sm90_tst_128x160", 0.15, 0.5] and ["loop_convert_fusion", 0.1, 1.0] in got["top"]
    host = prof.summarize({"traceEvents": meta[1:] + events[-1:]}, steps=1)
    assert host["where"].startswith("host XLA ops") and host["top"] == [["host_only_op", 9.999, 1.0]]
    with pytest.raises(RuntimeError, match="no kernel"):
        prof.summarize({"traceEvents": meta}, steps=1)


def test_the_gpu_followup_runs_bench_steps_own_cases_each_round_and_dry():
    follow = script(SCRIPT.with_name("gpu_followup.py"))
    for round_, cases in follow.ROUNDS.items():
        real, dry = follow.cases("/tmp/x", False, round_), follow.cases("/tmp/x", True, round_)
        assert [c["label"] for c in real] == [label for label, *_ in cases]
        assert {c["shape"] for c in dry} == {"tiny"} and {c["dtype"] for c in real} == {"bfloat16"}
        assert all(c["torch_compile"] == ("--torch-compile" in c["argv"]) for c in real)
    (online,) = [c for c in follow.cases("/tmp/x", False, 2) if c["label"] == "m5 online softmax"]
    assert (online["loss_softmax"], online["loss_logits"]) == ("online", "float32")
    assert any(c["profile"] == "/tmp/x/profile" for c in follow.cases("/tmp/x", False, 2))
