"""The README, CONTRIBUTING.md and docs/ are true: every figure README.md and docs/*.md quote is
what its recorded run (docs/results/, benchmarks/results/) renders, every code block of the
documents in ``DOCS`` runs as pasted or names what covers it, every relative link leads to a
file (and heading) that exists, the README stays a short front page, and ``loire_jax.run``
from Python leaves what ``python launch/train.py`` leaves, report included."""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from data_helpers import tiny_config_dict
from runs import ROOT, cli, one_line_error, run_numerics, tiny_run

from loire_jax.cli.scripts import script

# The documents whose code blocks are run (python) or classified in SHELL (bash).
DOCS = {name: ROOT / name for name in ("README.md", "CONTRIBUTING.md", "docs/library.md", "docs/interop.md",
                                       "docs/operations.md", "docs/results.md", "docs/encoders.md",
                                       "docs/finetune.md", "docs/performance.md")}
PUBLIC_ONLY = ("README.md", "docs/library.md", "docs/interop.md")  # they import public names only (``__all__``)
# a front page: the two commands, what they give, and links (200 before its Performance section, whose GPU table,
# issue 41, takes 6 more, and the GPU step variants' line 4)
README_MAX_LINES = 230
# What the README must link to: the front page leads to every part of the documentation.
README_LINKS = ("docs/operations.md", "docs/results.md", "docs/library.md", "docs/performance.md", "docs/data.md",
                "docs/finetune.md",
                "CONTRIBUTING.md")
FENCE = re.compile(r"^([ \t]*)```(\w*)\n(.*?)^\1```", re.S | re.M)  # at the margin or indented in a list


figures = script(ROOT / "tools" / "docs_figures.py")


def blocks(language: str) -> list[tuple[str, int, str]]:
    """(document, index among its blocks of that language, code) of every fenced block."""
    out = []
    for doc, path in DOCS.items():
        found = [textwrap.dedent(code) for _indent, lang, code in FENCE.findall(path.read_text()) if lang == language]
        out += [(doc, i, code) for i, code in enumerate(found)]
    return out


# --------------------------------------------------------------------------- quoted figures
def test_every_quoted_figure_equals_what_its_record_renders():
    assert figures.problems() == []


def test_a_changed_record_makes_the_check_fail_naming_the_figure(tmp_path, monkeypatch):
    shutil.copytree(figures.records.RESULTS, tmp_path / "results")
    path = tmp_path / "results" / "default-run" / "report.json"
    report = json.loads(path.read_text())
    report["runs"][0]["lifelong"][1]["AP"] += 1.0
    path.write_text(json.dumps(report))
    monkeypatch.setattr(figures.records, "RESULTS", tmp_path / "results")
    found = figures.problems()
    assert any("figures:default-run-report differs from its record" in line for line in found), found
    assert figures.main(["--check"]) == 1


def test_a_hand_edited_figure_in_any_document_fails_the_check_naming_it(tmp_path, monkeypatch):
    """Every document that quotes a figure is checked, docs/*.md as well as README.md: a number
    typed over a rendered one (here a benchmark's memory figure) is caught."""
    copies = []
    for doc in figures.DOCS:
        copy = tmp_path / doc.relative_to(figures.ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(doc.read_text())
        copies.append(copy)
    monkeypatch.setattr(figures, "ROOT", tmp_path)
    monkeypatch.setattr(figures, "DOCS", tuple(copies))
    assert figures.problems() == []
    for name, doc in (("default-run-report", "README.md"), ("bench-memory", "docs/results.md"),
                      ("bench-data", "docs/data.md")):
        text = (tmp_path / doc).read_text()
        quoted = figures.quoted(text)[name]
        edited = re.sub(r"\d\.\d", lambda m: "9" + m.group(0)[1:], quoted, count=1)
        assert edited != quoted
        (tmp_path / doc).write_text(text.replace(quoted, edited))
        assert f"{doc}: figures:{name} differs from its record; python tools/docs_figures.py --write renders it" \
            in figures.problems()
        (tmp_path / doc).write_text(text)


def test_the_recorded_measurements_are_within_what_the_tests_require():
    """The quoted measurements come from the code the tests check: the Hugging Face import within
    its bound, XLA's FLOPs within the analytic count's tolerance, float64 growth within 1e-9."""
    hf_rel = [float(x) for x in re.findall(r"relative (\S+)$", figures.load("hf-import")["stdout"], re.M)]
    assert len(hf_rel) == 3 and all(0.0 <= x <= 1e-5 for x in hf_rel), hf_rel
    gaps = [float(x) for x in re.findall(r"= ([+-][\d.]+)%$", figures.load("flops-xla")["stdout"], re.M)]
    assert len(gaps) == 2 and all(abs(g) <= 5.0 for g in gaps), gaps
    f64 = [float(x) for x in re.findall(r"max \|dlogits\| (\S+)$", figures.load("growth-f64")["stdout"], re.M)]
    assert len(f64) == 12 and all(x <= 1e-9 for x in f64), f64


def test_the_recorded_report_is_what_the_report_code_computes_from_the_recorded_metrics():
    """The figures were not typed: this code recomputes every number of the recorded report
    from the recorded metrics.jsonl and config, and would notice a change in how AP, AP+,
    FLOPs or wall times are computed."""
    from loire_jax.analysis.records import read_records
    from loire_jax.analysis.reports import summarize
    from loire_jax.config.loader import run_config_from_dict

    for name in ("default-run-first", "default-run"):
        folder = figures.records.RESULTS / name
        run = run_config_from_dict(json.loads((folder / "config.json").read_text()))
        records, bad = read_records(folder)
        assert bad == []
        (recorded,) = json.loads((folder / "report.json").read_text())["runs"]
        recorded.pop("workdir")
        assert recorded.pop("downstream") == []  # read from the workdir's fine-tunings: none in these runs
        for key in ("pretrained", "tokenizer"):  # read from the workdir and its checkpoints, not the records
            recorded.pop(key, None)
        assert json.loads(json.dumps(summarize(run, records, name=run.name))) == recorded, name


def test_the_recorded_commands_are_the_documented_ones_and_ran_cleanly():
    for name, spec in figures.RECORDINGS.items():
        record = figures.load(name)["record"]
        assert record["exit_code"] == 0 and record["wall_s"] > 0
        pattern = re.escape(" ".join(spec.command)).replace(r"\{workdir\}", r"\S+").replace(r"\{cache\}", r"\S+")
        assert re.fullmatch(pattern, record["command"]), name
        typed = " ".join(w for w in spec.command if w not in ("--workdir", "{workdir}", "--compile-cache", "{cache}"))
        # what the docs tell a user to type (line breaks of the rendered prose aside)
        assert any(typed in " ".join(doc.read_text().split()) for doc in figures.DOCS), typed


def test_a_suite_record_digests_every_step_and_a_rerun_that_parts_from_it_is_named(tmp_path):
    """paper-mini's runs.json: per run, a digest of every logged step; a rerun whose losses
    part from the record at one step is named with the hundred steps where they parted."""
    def write(root, loss_at_250):
        for run in ("runs/LOIRE/seed1", "sweep/a/GPT_L"):
            rows = [{"kind": "train", "stage": 1, "step": i, "loss": 5.0 - i / 1000, "grad_norm": 1.0}
                    for i in range(1, 401)]
            rows.append({"kind": "eval", "stage": 1, "point": "final", "domain": "WB", "ppl": 100.0})
            if run.startswith("runs"):  # a run that parts at step 250 stays apart
                for r in rows[249:400]:
                    r["loss"] += loss_at_250 - 4.75
            (root / run).mkdir(parents=True)
            (root / run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        return figures.records.suite_runs(root)

    want = write(tmp_path / "a", 4.75)
    assert sorted(want) == ["runs/LOIRE/seed1", "sweep/a/GPT_L"] and want["sweep/a/GPT_L"]["steps"] == 400
    assert figures.records.suite_differences(write(tmp_path / "b", 4.75), want) == []
    (diff,) = figures.records.suite_differences(write(tmp_path / "c", 4.7500001), want)
    assert diff.startswith("runs/LOIRE/seed1: its steps differ") and diff.endswith("by step 300)")
    got = write(tmp_path / "d", 4.75)
    del got["sweep/a/GPT_L"]
    assert figures.records.suite_differences(got, want) == ["sweep/a/GPT_L: in the record, not in the rerun"]


def test_the_growth_demo_record_has_the_parameter_counts_of_its_shapes():
    from loire_jax import param_count, preset

    rows = figures.demo_rows(figures.load("grow-demo")["stdout"])
    for step, _op, shape, params, _delta in rows:
        hidden, ffn, heads, layers = (int(x) for x in shape.strip("()").split(", "))
        cfg = preset("paper", vocab_size=50257, max_seq_len=1024, hidden=hidden, ffn=ffn, heads=heads, head_dim=64,
                     layers=layers)
        assert param_count(cfg) == int(params.replace(",", "")), step


def test_the_recorded_growth_deviations_are_within_the_demo_tolerance():
    stdout = figures.load("grow-demo")["stdout"]
    tolerance = float(re.search(r"tolerance on max \|dlogits\|: (\S+)", stdout).group(1))
    rows = figures.demo_rows(stdout)
    assert float(rows[0][4]) == 0.0 and all(0.0 <= float(r[4]) <= tolerance for r in rows)
    assert "function preserved at every step" in stdout


# --------------------------------------------------------------------------- code blocks
LIBRARY_RUN = 'load_run_config("configs/tiny.yaml"'  # the one block that needs the default corpus


@pytest.fixture(scope="module")
def fixture_config(tmp_path_factory) -> Path:
    """Two stages on the test fixtures' small corpus, shaped like configs/tiny.yaml (stage_defaults
    and all), so that the library example's overrides apply to it unchanged."""
    base = tmp_path_factory.mktemp("docs-config")
    config = tiny_run(tiny_config_dict(base / "data"), "docs", "1", eval={"every": 0, "batches": 2},
                      checkpoint={"save_every": 0, "keep": 1},
                      stage_defaults={"steps": 6, "warmup_steps": 2, "gate_ramp_steps": 2, "teachers": "all",
                                      "replay_ratio": 0.2, "beta": 0.1, "beta_steps": 2},
                      stages=[{"name": "A", "domains": ["SCI"], "teachers": "none", "replay_ratio": 0.0, "beta": 0.0,
                               "beta_steps": 0, "warmup_steps": 0, "gate_ramp_steps": 0},
                              {"name": "B", "domains": ["NEWS"], "growth": [{"op": "hidden", "size": 32}]}])
    path = base / "docs.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _exec(code: str, cwd: Path, monkeypatch) -> str:
    """Run a block as a script in ``cwd``; returns what it printed."""
    monkeypatch.chdir(cwd)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), run_numerics():
        exec(compile(code, "<docs block>", "exec"), {"__name__": "__main__"})
    return out.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize("doc,index,code", [b for b in blocks("python") if LIBRARY_RUN not in b[2]],
                         ids=[f"{doc}#{i}" for doc, i, code in blocks("python") if LIBRARY_RUN not in code])
def test_python_block_runs_as_pasted(doc, index, code, tmp_path, monkeypatch):
    _exec(code, tmp_path, monkeypatch)


def test_only_the_library_run_example_is_not_executed_verbatim():
    held_back = [(doc, i) for doc, i, code in blocks("python") if LIBRARY_RUN in code]
    assert held_back == [("docs/library.md", 0)]


@pytest.fixture(scope="module")
def library_run(fixture_config, tmp_path_factory):
    """The library run example, verbatim but for its config path, in a fresh directory; its output."""
    (code,) = [code for _doc, _i, code in blocks("python") if LIBRARY_RUN in code]
    assert code.count('"configs/tiny.yaml"') == 1
    cwd = tmp_path_factory.mktemp("library-run")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOIRE_PROGRESS", "bar")  # the bar a terminal would show, for the hook example to print above
        printed = _exec(code.replace('"configs/tiny.yaml"', repr(str(fixture_config))), cwd, mp)
    return cwd / "runs" / "tiny-lib", printed


@pytest.mark.slow
def test_the_library_run_example_runs_with_only_its_config_path_replaced(library_run):
    workdir, printed = library_run
    assert printed.rstrip().endswith(str(workdir.resolve() / "report" / "report.md"))


@pytest.mark.slow
def test_the_hook_example_prints_above_the_progress_bar_not_into_it(library_run):
    _workdir, printed = library_run
    said = [line.rsplit("\r", 1)[-1] for line in printed.split("\n") if " step 10: loss " in line]
    assert len(said) == 2, printed[-2000:]  # stage 1 and stage 2, step 10
    assert all(re.fullmatch(r"M[12] step 10: loss \d+\.\d{3}", line) for line in said), said
    assert "it/s" in printed or "step/s" in printed or "s/step" in printed  # the bar was there to break


def test_say_writes_a_whole_line_above_a_live_bar():
    from tqdm import tqdm

    from loire_jax.train.hooks import say

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bar = tqdm(total=4, file=sys.stdout, desc="stage 1/1")
        bar.update(1)
        say("hello", 1)
        bar.close()
    lines = [line.rsplit("\r", 1)[-1] for line in out.getvalue().split("\n")]
    assert "hello 1" in lines, out.getvalue()


def public_imports(code: str) -> list[str]:
    """What a code block imports from loire_jax other than public names: ``from loire_jax import
    NAME`` with NAME in ``loire_jax.__all__``, or ``from loire_jax.SUBPACKAGE import NAME`` with
    NAME in that subpackage's ``__all__``. The problems, one line each."""
    bad = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "loire_jax":
            if node.module.count(".") > 1:
                bad.append(f"from {node.module} import ...: a module, not the public API")
                continue
            public = getattr(importlib.import_module(node.module), "__all__", ())
            bad += [f"{node.module}.{a.name} is not in {node.module}.__all__" for a in node.names
                    if a.name not in public]
        elif isinstance(node, ast.Import):
            bad += [f"import {a.name}: not the public API" for a in node.names
                    if a.name.startswith("loire_jax.")]
    return bad


def test_the_readme_and_library_examples_use_only_the_public_api():
    found = [(doc, i, problem) for doc, i, code in blocks("python") if doc in PUBLIC_ONLY
             for problem in public_imports(code)]
    assert found == []
    assert {doc for doc, _i, _code in blocks("python")} >= set(PUBLIC_ONLY)  # the check has blocks to check


def test_the_public_api_check_catches_a_private_import():
    assert public_imports("from loire_jax import grow\nfrom loire_jax.train import say\nimport jax\n") == []
    assert public_imports("from loire_jax.train.hooks import say\n") == [
        "from loire_jax.train.hooks import ...: a module, not the public API"]
    assert public_imports("from loire_jax import _lazy\n") == ["loire_jax._lazy is not in loire_jax.__all__"]
    assert public_imports("from loire_jax.train import trainer\n") == [
        "loire_jax.train.trainer is not in loire_jax.train.__all__"]
    assert public_imports("import loire_jax.growth\n") == ["import loire_jax.growth: not the public API"]


# --------------------------------------------------------------------------- the README and the links
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where brackets are not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a document's headings (lowercase, punctuation dropped, spaces to
    hyphens, repeats numbered)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(root: Path) -> list[str]:
    """Every relative link of README.md, CONTRIBUTING.md and docs/**/*.md under ``root`` whose
    file, or whose heading after ``#``, does not exist: one line each."""
    documents = [root / "README.md", root / "CONTRIBUTING.md", *sorted((root / "docs").rglob("*.md"))]
    bad = []
    for doc in documents:
        text = doc.read_text()
        for target in LINK.findall(_prose(text)):
            if re.match(r"[a-z][a-z+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            where = f"{doc.relative_to(root)}: ({target})"
            if not dest.exists():
                bad.append(f"{where} leads to no file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                bad.append(f"{where}: {dest.name} has no heading #{anchor}")
    return bad


def test_the_readme_is_a_short_front_page_linking_every_part_of_the_documentation():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, len(text.splitlines())
    linked = {target.partition("#")[0] for target in LINK.findall(_prose(text))}
    assert [doc for doc in README_LINKS if doc not in linked] == []
    # the two commands on the first screen, before anything but the introduction
    first_screen = "\n".join(text.splitlines()[:45])
    assert "pip install -e . && python launch/train.py --mesh 8" in first_screen
    assert "pip install -e '.[test]' && ruff check . && python -m pytest" in first_screen
    # and the test command is the one CI runs
    ci = (ROOT / ".ci" / "run").read_text()
    assert [line for line in text.splitlines() if line.startswith("pip install -e '.[test]'")][0] in ci.splitlines()


def test_every_relative_link_leads_to_a_file_and_heading_that_exist():
    assert broken_links(ROOT) == []


def test_a_broken_link_or_anchor_is_caught(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Some `code`: here (too)\n")
    (tmp_path / "CONTRIBUTING.md").write_text("[a](docs/a.md#some-code-here-too) `[not](a-link.md)`\n")
    (tmp_path / "README.md").write_text("[a](docs/a.md) [b](https://example.org/x.md)\n")
    assert broken_links(tmp_path) == []
    (tmp_path / "README.md").write_text("[a](docs/b.md) [c](docs/a.md#nowhere)\n")
    assert broken_links(tmp_path) == ["README.md: (docs/b.md) leads to no file",
                                      "README.md: (docs/a.md#nowhere): a.md has no heading #nowhere"]


# --------------------------------------------------------------------------- the CLI and run() agree
def _files(workdir: Path) -> set[str]:
    """The workdir's files, with the names that hold a time, a host or a content hash (TensorBoard's
    event files, OCDBT's data files) reduced to their folder."""
    out = set()
    for p in workdir.rglob("*"):
        if p.is_file():
            rel = p.relative_to(workdir).as_posix()
            rel = re.sub(r"events\.out\.tfevents\..*", "events.out.tfevents.*", rel)
            out.add(re.sub(r"/d/[0-9a-f]+$", "/d/*", rel))
    return out


@pytest.mark.slow
def test_run_from_python_writes_the_report_and_files_the_cli_writes(library_run, fixture_config, tmp_path):
    from_python, _ = library_run
    done = cli(fixture_config, tmp_path / "cli", "optimizer.lr=2e-3", "stage_defaults.steps=20")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"report: {(tmp_path / 'cli').resolve() / 'report' / 'report.md'}" in done.stdout
    cli_files = _files(tmp_path / "cli")
    assert {f for f in cli_files if f.startswith("report/")} == {
        "report/.loire_report", "report/report.md", "report/report.json", "report/ap.png", "report/ppl_heatmap.png",
        "report/init_final.png", "report/training.png"}
    assert cli_files - {"python.log"} == _files(from_python)  # python.log: the CLI's library log file
    (a,) = json.loads((tmp_path / "cli" / "report" / "report.json").read_text())["runs"]
    (b,) = json.loads((from_python / "report" / "report.json").read_text())["runs"]
    assert [r["AP"] for r in a["lifelong"]] == pytest.approx([r["AP"] for r in b["lifelong"]], rel=1e-5)


@pytest.mark.slow
def test_run_from_python_refuses_with_the_line_the_cli_prints(fixture_config, tmp_path):
    from loire_jax import load_run_config, run

    foreign = tmp_path / "not-a-run"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    line = one_line_error(cli(fixture_config, foreign, "--fresh"))
    with pytest.raises(Exception) as err:
        run(load_run_config(fixture_config), foreign, fresh=True)
    assert line == f"error: {err.value}"
    assert (foreign / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_a_report_that_fails_after_a_complete_run_is_one_line_naming_the_retry(library_run, tmp_path):
    from loire_jax import run
    from loire_jax.analysis.reports import ReportError
    from loire_jax.config.loader import run_config_from_dict
    from loire_jax.train.hooks import Hook, default_hooks

    workdir = tmp_path / "done"
    shutil.copytree(library_run[0], workdir)
    shutil.rmtree(workdir / "report")
    cfg = run_config_from_dict(json.loads((workdir / "config.json").read_text()))

    class BlockReport(Hook):  # a file where the report's folder goes: the report cannot be written
        def on_run_end(self, trainer):
            (trainer.workdir / "report").write_text("in the way")

    with pytest.raises(ReportError) as err, run_numerics():
        run(cfg, workdir, mesh="1", progress=False, hooks=[*default_hooks(cfg, progress=False), BlockReport()])
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("the run is complete, but its report failed: ")
    assert message.endswith(f"; rerun it with loire-report {workdir.resolve()}")


# --------------------------------------------------------------------------- shell commands
# Every shell command of the documents in DOCS: "run" (executed verbatim below), or "not run here"
# with the reason and what covers it.
# "chained": run by test_the_readme_run_and_every_fine_tuning_command_run_in_a_chain, in document order, on
# the runs/tiny that the README's command leaves (the corpus replaced by the fixtures' with --config, and
# each fine-tuning shortened by the documented --quick and caps).
CHAINED = "chained"
SHELL = {
    # README.md and docs/finetune.md
    "python launch/finetune.py runs/tiny --task amazon_sentiment --quick": CHAINED,
    "python launch/finetune.py runs/tiny --task boolq": CHAINED,
    "python launch/finetune.py runs/tiny --task boolq --stage 3 --seeds 1,2,3 lr=1e-4 epochs=3": CHAINED,
    "python launch/finetune.py runs/tiny --task boolq --task imdb": CHAINED,
    # README.md
    "pip install -e . && python launch/train.py --mesh 8": CHAINED,  # the install is the environment's
    "pip install -e '.[test]' && ruff check . && python -m pytest -m \"not slow\" && python -m pytest -m slow":
        "not run here: it is this suite (lint, then the fast tier, then the slow tier); .ci/run runs it verbatim",
    # docs/operations.md
    "pip install -e '.[tensorboard]'":
        "not run here: the install is the environment's; test_install.py installs the wheel and runs its scripts",
    "python launch/train.py --config configs/gpt_paper.yaml --workdir /shared/runs/paper --coordinator host0:1234 "
    "--num-processes 2 --process-id 0":
        "not run here: it needs two hosts and the paper's TFDS data; tests/test_multiprocess.py runs two local "
        "processes joined the same way",
    # docs/interop.md
    "pip install -e '.[hf]'":
        "not run here: the install is the environment's, and this machine cannot reach the Hub; tests/test_hub.py "
        "runs the client offline and against a stand-in for the Hub",
    "pip install -e '.[gcs]'":
        "not run here: the install is the environment's, and this machine has no Cloud Storage; tests/test_paths.py "
        "runs the object-store code paths on local paths",
    "WORKDIR=/shared/runs/paper sbatch launch/slurm.sbatch --config configs/gpt_paper.yaml":
        "not run here: no SLURM; tests/test_multiprocess.py gives two local processes SLURM's variables",
    "pip install -e '.[cuda12]'":
        "not run here: the install is the environment's, and this machine has no GPU; test_install.py checks that "
        "the extra is jax[cuda12] within the base jax bound",
    'python -c "import jax; print(jax.devices())"': "run",
    "python tools/make_hf_fixtures.py --export OUT":
        "not run here: it grows and exports every fixture for the check below (seconds); tests/test_hf_families.py "
        "grows, exports and re-imports each family's fixture the same way",
    "python tools/make_hf_fixtures.py --check OUT/* --record tests/fixtures/hf/export_check.json":
        "not run here: it needs torch and transformers; tests/test_hf_families.py reads the record it wrote",
    "python launch/train.py --config tiny model.preset=qwen2 model.kv_heads=2 --workdir runs/qwen2-tiny":
        "not run here (needs the corpus); test_the_interop_qwen2_example_runs_on_the_fixture_corpus runs it and the "
        "two exports after it on the fixtures' corpus, one step a stage",
    "python launch/export_hf.py runs/qwen2-tiny runs/qwen2-tiny-hf":
        "not run here: see the line above",
    "python launch/export_hf.py runs/qwen2-tiny runs/qwen2-tiny-m2 --stage 2":
        "not run here: see the line above",
    "WORKDIR=/shared/runs/paper MESH=16 sbatch --partition=gpu --nodes=2 --gpus-per-node=8 launch/slurm.sbatch "
    "--config gpt_paper":
        "not run here: no SLURM and no GPU; tests/test_batch_scripts.py runs the script with stand-ins for srun and "
        "scontrol",
    "launch/tpu_pod.sh TPU_NAME ZONE gs://BUCKET/runs/paper --config configs/gpt_paper.yaml "
    "data.data_dir=gs://BUCKET/loire_data":
        "not run here: no Cloud TPU (it has not run on a real one yet)",
    # docs/results.md
    "python launch/report.py runs/experiments/paper-mini/runs/{LOIRE,GPT_L}/seed1":
        "not run here (needs the suite's runs); tests/test_trainer.py runs launch/report.py on two workdirs",
    "python launch/experiment.py --suite paper-mini --list": "run",
    "python launch/experiment.py --suite paper-mini":
        "not run here (125 runs and 64 fine-tunings, 134 min on 2 cores with a second worker; docs/results/paper-mini "
        "records them); "
        "tests/test_experiment.py runs a micro suite end to end",
    "python launch/experiment.py --suite rivals-mini --list": "run",
    "python launch/experiment.py --suite rivals-mini":
        "not run here (12 runs, about 15 minutes); tests/test_rivals_run.py runs ELLE and LiGO end to end, "
        "resumes included",
    "python launch/experiment.py --suite my_suite.yaml --list":
        "not run here (it needs my_suite.yaml beside it); test_the_suite_on_your_own_data_runs_as_written runs it",
    "python launch/experiment.py --suite my_suite.yaml --workdir runs/my-suite":
        "not run here (nine runs); test_the_suite_on_your_own_data_runs_as_written runs it with --seeds 1",
    "python launch/experiment.py --suite paper --seeds 1,2,3 --workdir gs://bucket/paper":
        "not run here: the paper's scale, for GPU and TPU nodes; tests/test_experiment.py runs a micro suite",
    "python launch/train.py --config configs/tiny_gpt2_general.yaml --mesh 8":
        "not run here (needs the corpus); tests/test_trainer.py starts a stage from another run's checkpoint",
    "python launch/train.py --config configs/tiny_gpt2.yaml --mesh 8":
        "not run here (needs the corpus and the run above); see the line above",
    "python benchmarks/bench_step.py --shapes m1 --batch 8 --seq 256 --vocab 8192 --steps 5 --torch --json "
    "benchmarks/results/cpu-m1-target.json":
        "not run here: minutes, and it needs torch; it wrote the record the bench-throughput figure renders, and "
        "tests/test_benchmarks.py runs bench_step.py on a small case",
    "python benchmarks/bench_step.py --shapes tiny --teachers 0,1,4 --dtypes float32,bfloat16 --torch --json "
    "benchmarks/results/cpu-tiny.json":
        "not run here: as the line above",
    "python tools/docs_figures.py --check": "run",
    # docs/performance.md
    "python -m loire_jax.data prepare --config default_gpt2":
        "not run here: it downloads the pinned openai-whisper sdist for GPT-2's vocabulary and tokenizes the "
        "built-in stream; tests/data covers prepare on the fixture corpus",
    "python launch/experiment.py --suite paper-gpu-probe --dry-run --compile-cache /scratch/xla":
        "not run here: it needs the GPT-2-tokenized corpus; tests/test_experiment.py runs the same dry run on the "
        "fixture corpus",
    "python launch/experiment.py --suite paper-gpu-probe --seeds 1 --compile-cache /scratch/xla --workdir "
    "runs/probe/seed1":
        "not run here: it is for one GPU (about 6-8 minutes on an H100); tests/test_experiment.py runs the same "
        "procedure (one seed a workdir, merged) at its dry-run shapes",
    "python launch/experiment.py --suite paper-gpu-probe --seeds 2 --compile-cache /scratch/xla --workdir "
    "runs/probe/seed2": "not run here: as the line above",
    "python launch/experiment.py --suite paper-gpu-probe --seeds 3 --compile-cache /scratch/xla --workdir "
    "runs/probe/seed3": "not run here: as the line above",
    "python launch/experiment.py --suite paper-gpu-probe --workdir runs/probe/all --merge runs/probe/seed1 "
    "runs/probe/seed2 runs/probe/seed3":
        "not run here: it needs the three seeds' GPU runs; tests/test_experiment.py merges three dry-run seeds the "
        "same way, and tests/test_suite_plan.py every refusal",
    # docs/operations.md, a suite on a cluster
    "python launch/experiment.py --suite paper --plan": "run",
    "python launch/experiment.py --suite paper --workdir /shared/suites/paper --index 7":
        "not run here: the paper's scale; tests/test_experiment.py runs one item of a micro suite by --index",
    "launch/slurm_suite.sh --max-running 16 /shared/suites/paper --nodes=1 --gpus-per-node=8 --time=24:00:00 -- "
    "--suite paper --mesh 8 --compile-cache /shared/xla":
        "not run here: no SLURM; tests/test_slurm_suite.py runs it with a stand-in for sbatch, and "
        "tools/slurm_local_check.sh suite on a real one",
    "launch/tpu_pod.sh my-v5p-32 us-east5-a gs://BUCKET/suites/paper --suite paper --index 0-6":
        "not run here: no Cloud TPU (it has not run on a real one yet)",
    "launch/tpu_pod.sh my-v5p-32 us-east5-a gs://BUCKET/suites/paper --suite paper --index 7-65":
        "not run here: as the line above",
    "python launch/experiment.py --suite paper --workdir /shared/suites/paper --status":
        "not run here: it needs the suite's workdir; tests/test_suite_plan.py reads a fabricated one",
    "python benchmarks/bench_compile.py":
        "not run here: minutes (six five-stage runs); it made docs/results/bench-compile, and the accelerator "
        "check's dry run (tests/test_accelerator_check.py) runs it on a two-stage toy config",
    "python benchmarks/accelerator_check.py --out DIR --list": "run",
    "python benchmarks/accelerator_check.py --out DIR --budget-min 25":
        "not run here: it is for a GPU node (about 25 minutes); tests/test_accelerator_check.py runs the same plan "
        "with --dry-run and loads every config of the real plan",
    "python benchmarks/accelerator_check.py --out DIR --dry-run":
        "not run here: tests/test_accelerator_check.py runs it (slow tier)",
    'python benchmarks/accelerator_check.py --out DIR --parts variants --variants scanned,"weights cast once"':
        "not run here: it is for a GPU; tests/test_accelerator_check.py checks --variants' choice and refusal",
    "python benchmarks/accelerator_check.py --out DIR --parts variants --budget-min 9":
        "not run here: it is for a GPU; tests/test_accelerator_check.py runs the variants part with --dry-run "
        "(slow tier)",
    "python benchmarks/accelerator_check.py --out DIR --parts step,variants --budget-min 9":
        "not run here: it is for a GPU (under 9 minutes of an H100 by its estimate, which "
        "tests/test_accelerator_check.py holds there); the same test file runs both parts with --dry-run (slow tier)",
    "python benchmarks/accelerator_check.py --out DIR --parts step --cases m5-32x1024-t0,1b-8x1024-t0":
        "not run here: it is for a GPU; tests/test_accelerator_check.py lists and refuses case names in-process",
    "python tools/docs_figures.py --reproduce paper-mini --runs runs/LOIRE/seed1,runs/GPT_L/seed1":
        "not run here: minutes (two of paper-mini's runs); tests/test_figures_tool.py plans named runs as the suite "
        "did, reruns them with training replaced, and names one that parts from the record",
    "python tools/docs_figures.py --reproduce default-run":
        "not run here: minutes (the whole default run); test_the_recorded_report_is_what_the_report_code_computes_"
        "from_the_recorded_metrics recomputes its report",
    # CONTRIBUTING.md
    'python -m pytest -m "not slow"': "not run here: it is this suite's fast tier",
    "python -m pytest -m slow": "not run here: it is this suite's slow tier",
    "python -m pytest -x -q -n 0 tests/test_growth_exactness.py -k hidden":
        "not run here: an example of a targeted run; the tests it selects are in the fast tier",
    "ruff check .": "not run here: .ci/run runs it before the tests",
    ".ci/run": "not run here: it builds a fresh virtual environment and runs the whole suite",
    # docs/encoders.md
    "python launch/train.py --config bert_tiny --mesh 8":
        "not run here: minutes; it made docs/results/bert-tiny (python tools/docs_figures.py --reproduce bert-tiny "
        "reruns it), and tests/test_encoder_run.py runs an encoder run end to end, resumed after SIGTERM",
    "python launch/train.py --config bert_paper":
        "not run here: it needs TFDS Wikipedia and an accelerator; tests/test_run_config.py loads every preset",
    "python launch/train.py --config bert_paper_5domain":
        "not run here: it needs the paper's TFDS datasets and an accelerator; tests/test_run_config.py loads every "
        "preset",
}
LAUNCHERS = ("launch/slurm.sbatch", "launch/tpu_pod.sh")  # they pass their arguments on to launch/train.py (or experiment.py)


def shell_commands() -> list[str]:
    out = []
    for _doc, _i, code in blocks("bash"):
        for line in code.replace("\\\n", " ").splitlines():
            line = line.split("  #", 1)[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def test_every_shell_command_in_the_docs_is_run_or_names_what_covers_it():
    assert sorted(set(shell_commands())) == sorted(SHELL)  # a command may appear in several documents
    assert all(how in ("run", CHAINED) or how.startswith("not run here") for how in SHELL.values())
    # every fine-tuning command of the README and docs/finetune.md runs on the README's run
    assert all(SHELL[c] == CHAINED for c in shell_commands() if "launch/finetune.py" in c)


@functools.lru_cache(maxsize=None)
def _help(script: str) -> str:
    done = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _extra(name: str) -> list[str]:
    """The requirements of one extra in setup.cfg (empty if there is no such extra)."""
    extras = (ROOT / "setup.cfg").read_text().split("[options.extras_require]", 1)[1].split("\n[", 1)[0]
    found = re.search(rf"^{re.escape(name)}\s*=[^\n]*\n((?:[ \t]+.*\n?|\s*\n)*)", extras, re.M)
    lines = found.group(1).splitlines() if found else []
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c, how in SHELL.items() if how not in ("run", CHAINED)])
def test_a_shell_command_not_run_names_scripts_and_flags_that_exist(command):
    """Parsed only: each ``python SCRIPT`` exists and its ``--help`` lists every ``--flag`` the
    command uses (for the cluster launchers, ``launch/train.py``'s, which they pass them to);
    ``python -m MODULE`` names an importable module; ``pip install -e '.[X]'`` names an extra
    that exists (``test`` brings pytest-xdist and ruff, ``tensorboard`` the viewer); other
    programs are scripts of the checkout or tools the test extra installs."""
    for part in command.split("&&"):
        words = shlex.split(part)
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VAR=value before the program
            words = words[1:]
        flags = [w for w in words if w.startswith("--")]
        if words[0] == "pip":
            for extra in re.findall(r"\.\[(\w+)\]", part):
                assert _extra(extra), f"setup.cfg has no extra {extra!r}"
            continue
        if words[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(words[2]) is not None, words[2]
            paths = [w for w in words[3:] if w.startswith("tests/")]
            assert all((ROOT / w).exists() for w in paths), paths
            continue
        if words[0] == "python":
            assert (ROOT / words[1]).exists(), words[1]
            assert all(flag in _help(words[1]) for flag in flags), (flags, _help(words[1])[-2000:])
            continue
        if words[0] == "sbatch":  # sbatch's own options (--opt=value) come before the script, the run's after it
            words = words[1:]
            while words and words[0].startswith("-"):
                words = words[1:]
            flags = [w for w in words if w.startswith("--")]
        script = words[0]
        if script in LAUNCHERS:  # they pass their arguments to launch/train.py, or from --suite on to experiment.py
            assert (ROOT / script).exists(), script
            to = "launch/experiment.py" if "--suite" in flags else "launch/train.py"
            assert all(flag in _help(to) for flag in flags), (flags, to)
            continue
        if (ROOT / script).is_file():  # a script of the checkout (.ci/run)
            assert os.access(ROOT / script, os.X_OK), f"{script} is not executable"
            continue
        assert any(re.match(rf"{re.escape(script)}\b", req) for req in _extra("test")), \
            f"{script}: neither a script of the checkout nor a tool the test extra installs"
    if "[test]" in command:  # the extra exists and brings pytest-xdist, which -n and --dist need
        extras = (ROOT / "setup.cfg").read_text().split("[options.extras_require]", 1)[1]
        assert re.search(r"^test\s*=(\s*\n\s+\S.*)*?pytest-xdist", extras, re.M), extras[:500]
    if "[tensorboard]" in command:  # the extra exists and brings the viewer the docs tell users to start
        extras = (ROOT / "setup.cfg").read_text().split("[options.extras_require]", 1)[1]
        assert re.search(r"^tensorboard\s*=(\s*\n\s+\S.*)*?\n\s+tensorboard>=", extras, re.M), extras[:500]


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c, how in SHELL.items() if how == "run"])
def test_a_cheap_shell_command_runs_verbatim(command):
    done = subprocess.run(command, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          executable="/bin/bash", env={**os.environ, "PATH": _path_with_python()})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def _path_with_python() -> str:
    """PATH with this interpreter's folder first, so ``python`` is the one the tests run under."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


# --------------------------------------------------------------------------- the README's run, then fine-tuning
FINETUNE_DOCS = ("README.md", "docs/finetune.md")
SHORTER = "--quick max_train_examples=32 max_eval_examples=32 epochs=1 --mesh 2"  # documented: docs/finetune.md


def _readme_run_config(base: Path) -> Path:
    """configs/tiny.yaml as it is (five stages, its model: 128 positions, its mesh), on the fixtures'
    corpus under the default run's domain names, one step a stage."""
    from data_helpers import local_domain

    cfg = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    files = {"WB": "science.txt", "NEWS": "news.jsonl", "REV": "reviews.txt", "BIO": "science.txt", "CS": "reviews.txt"}
    cfg["data"] = tiny_config_dict(base / "data", domains=[local_domain(n, f) for n, f in files.items()])
    cfg["model"]["vocab_size"] = 320  # the fixtures' tokenizer
    cfg["eval"]["batches"] = 1
    cfg["optimizer"]["warmup_steps"] = 1
    cfg["stage_defaults"].update(steps=1, warmup_steps=1, gate_ramp_steps=1, beta_steps=1)
    downloads = base / "data" / "downloads"  # the built-in tasks' pinned files: the user's cache, else fetched
    downloads.mkdir(parents=True)
    cache = Path(os.path.expanduser("~/.cache/loire_jax/downloads"))
    for f in cache.iterdir() if cache.is_dir() else ():
        (downloads / f.name).symlink_to(f)
    path = base / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_the_readme_run_and_every_fine_tuning_command_run_in_a_chain(tmp_path):
    """The README's main command leaves runs/tiny; then every fine-tuning command of the README and
    docs/finetune.md, as written and in document order, runs on it (shortened by SHORTER)."""
    config = _readme_run_config(tmp_path)
    (tmp_path / "launch").symlink_to(ROOT / "launch")
    env = {**os.environ, "PATH": _path_with_python(), "JAX_PLATFORMS": "cpu", "LOIRE_PROGRESS": "lines"}
    env.pop("JAX_ENABLE_X64", None)

    def sh(command: str) -> subprocess.CompletedProcess:
        done = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                              executable="/bin/bash", env=env)
        assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
        assert "Traceback" not in done.stderr
        return done

    (train,) = [c for c in shell_commands() if c.endswith("python launch/train.py --mesh 8")]
    sh(f"{train.split('&& ', 1)[1]} --config {config}")  # the install is the environment's
    assert (tmp_path / "runs" / "tiny" / "report" / "report.md").is_file()
    commands = [line for doc in FINETUNE_DOCS for _d, _i, code in blocks("bash") if _d == doc
                for line in code.splitlines() if line.startswith("python launch/finetune.py")]
    assert len(commands) == 4, commands
    for command in commands:
        done = sh(f"{command.split('  #', 1)[0].strip()} {SHORTER}")
        assert re.search(r"seed \d: step 1/\d+ \(\d+%\)", done.stdout) or "done earlier" in done.stdout, done.stdout
        assert "trivial baseline" in done.stdout
    report = (tmp_path / "runs" / "tiny" / "report" / "report.md").read_text()
    assert "| trivial baseline |" in report
    assert all(f"{job} (M{k})" in report for job, k in (("amazon_sentiment-quick", 5), ("boolq-quick", 3),
                                                          ("boolq-quick", 5), ("imdb-quick", 5)))


@pytest.mark.slow
def test_the_interop_qwen2_example_runs_on_the_fixture_corpus(tmp_path):
    """docs/interop.md's Qwen2 example as written, but for tiny's corpus (the fixtures', one step a
    stage, as the README's run above): the five stages train, the last exports as Qwen2ForCausalLM
    and loads back, and stage 2's export is refused in one line naming the nearest growth."""
    config = yaml.safe_load(_readme_run_config(tmp_path).read_text())
    config["mesh"] = "2"  # the example's own mesh is the device count; 2 simulated CPUs are quicker here
    config["stages"][-1]["steps"] = 2  # the layer copies' gates reach 1 (ramped over one step) before the export
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "launch").symlink_to(ROOT / "launch")
    (block,) = [code for doc, _i, code in blocks("bash") if doc == "docs/interop.md" and "qwen2-tiny" in code]
    commands = [line.strip() for line in block.splitlines() if line.strip()]
    env = {**os.environ, "PATH": _path_with_python(), "JAX_PLATFORMS": "cpu", "LOIRE_PROGRESS": "lines"}
    env.pop("JAX_ENABLE_X64", None)
    done = [subprocess.run(c.replace("--config tiny ", f"--config {tmp_path / 'tiny.yaml'} "), shell=True,
                           cwd=tmp_path, capture_output=True, text=True, timeout=900, executable="/bin/bash", env=env)
            for c in commands]
    assert [d.returncode for d in done] == [0, 0, 2], [d.stderr[-2000:] for d in done]
    assert all("Traceback" not in d.stderr for d in done)
    (quoted,) = [line for line in DOCS["docs/interop.md"].read_text().splitlines()
                 if line.startswith("error: cannot export: Qwen2ForCausalLM")]
    assert done[2].stderr.strip().splitlines() == [quoted]
    assert not (tmp_path / "runs" / "qwen2-tiny-m2").exists()
    from loire_jax.interop import hf

    cfg, _ = hf.load(tmp_path / "runs" / "qwen2-tiny-hf")
    assert json.loads((tmp_path / "runs" / "qwen2-tiny-hf" / "config.json").read_text())["architectures"] == [
        "Qwen2ForCausalLM"]
    assert (cfg.qkv_bias, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.layers) == (True, 128, 8, 4, 4)


# --------------------------------------------------------------------------- a suite on your own data
@pytest.mark.slow
def test_the_suite_on_your_own_data_runs_as_written(tmp_path):
    """docs/results.md's two files, as written, beside small texts laid out as it says: the
    suite lists, runs (one seed: three runs) and reports, and a claim short of seeds names
    every opponent that lacked them. The data cache is the documented default, under a home
    of the test's own."""
    section = (ROOT / "docs" / "results.md").read_text().split("### A suite on your own data", 1)[1]
    run_yaml, suite_yaml = [textwrap.dedent(code) for _i, lang, code in FENCE.findall(section) if lang == "yaml"][:2]
    (tmp_path / "my_run.yaml").write_text(run_yaml)
    (tmp_path / "my_suite.yaml").write_text(suite_yaml)
    fixtures = ROOT / "tests" / "data" / "fixtures"
    (tmp_path / "texts" / "forum").mkdir(parents=True)
    shutil.copy(fixtures / "science.txt", tmp_path / "texts" / "forum" / "science.txt")
    shutil.copy(fixtures / "news.jsonl", tmp_path / "texts" / "papers.jsonl")
    (tmp_path / "launch").symlink_to(ROOT / "launch")
    env = {**os.environ, "PATH": _path_with_python(), "JAX_PLATFORMS": "cpu", "HOME": str(tmp_path / "home"),
           "MPLCONFIGDIR": str(tmp_path / "mpl")}
    env.pop("JAX_ENABLE_X64", None)
    commands = [c for c in shell_commands() if "my_suite.yaml" in c]
    assert len(commands) == 2, commands
    for command, extra in zip(commands, ("", " --seeds 1")):
        done = subprocess.run(command + extra, shell=True, cwd=tmp_path, capture_output=True, text=True,
                              timeout=900, executable="/bin/bash", env=env)
        assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
        assert "Traceback" not in done.stderr
    assert (tmp_path / "home" / ".cache" / "loire_jax").is_dir()  # the documented default data cache
    report = (tmp_path / "runs" / "my-suite" / "report" / "report.md").read_text()
    assert re.search(r"fewer than 3 paired seeds of LOIRE and each of GPT_L \(\d paired\), ER \(\d paired\)", report)


def test_a_record_names_the_tree_as_it_was_when_its_command_started(monkeypatch):
    """``uncommitted_changes`` is read before the command runs, and the records themselves
    (docs/results/, which re-recording rewrites) do not count: read after the new record was
    stored, it would call every re-recorded run dirty."""
    records = figures.records
    status = {"now": "M docs/results/default-run/record.json\n M docs/results/grow-demo/stdout.txt"}  # as stripped
    monkeypatch.setattr(records, "_git", lambda *args: status["now"] if args[0] == "status" else "abc")
    assert records.tree_changes() == ""
    status["now"] += "\n M loire_jax/train/step.py"
    assert records.tree_changes() == " M loire_jax/train/step.py"
    status["now"] = "M loire_jax/train/step.py"  # a change to code, first and stripped: it counts
    assert records.tree_changes() == "M loire_jax/train/step.py"
    status["now"] = "unknown"
    assert records.tree_changes() == "unknown"


def test_the_readme_stays_a_front_page():
    """What it is, the two commands and links: at most 220 lines; the rest belongs in docs/."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 220
