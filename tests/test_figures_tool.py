"""``tools/docs_figures.py`` as a user meets it: ``--record`` replaces only the files it wrote
(a record folder's ``.loire_record`` lists them) and refuses any other before its command
runs; ``--reproduce`` reads the record before running anything, and ``--runs`` reruns a few
named runs of a suite record; a missing or damaged record file is one line naming it; a
record that claims first use must show its corpus built, and its command gets empty caches.

Every case runs in-process on fabricated records (``RESULTS`` pointed at a copy), with the
commands the tool would start replaced: nothing here trains."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from data_helpers import tiny_config_dict
from runs import ROOT

from loire_jax import outputs
from loire_jax.cli.scripts import script

figures = script(ROOT / "tools" / "docs_figures.py")
records = figures.records

BUILT = ("[loire_jax.data] WB: 120 documents (0 too short dropped) written as ArrayRecord in 1.2s\n"
         "[loire_jax.data] training a 1024-piece BPE on the training splits ...\n"
         "[loire_jax.data] BPE trained in 34.8s\n[loire_jax.data] ready in 284.7s: /home/u/.cache/loire_jax\n")
CACHED = "[loire_jax.data] ready in 0.1s: /home/u/.cache/loire_jax\n"


@pytest.fixture
def results(tmp_path, monkeypatch):
    """A copy of docs/results that the tool reads and writes instead, and no command started:
    any the tool would run fails the test (``ran`` collects them where a case allows one)."""
    shutil.copytree(records.RESULTS, tmp_path / "results")
    monkeypatch.setattr(records, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(figures.spot, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(records, "_git", lambda *args: "" if args[0] == "status" else "abc")
    monkeypatch.setattr(records, "machine", lambda: "a machine")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the temporary workdirs and HOMEs the tool makes

    def no_command(*args, **kwargs):
        raise AssertionError(f"a command ran before the tool checked what it needed: {args[0]}")

    monkeypatch.setattr(subprocess, "run", no_command)
    return tmp_path / "results"


def _store(name: str, stderr: str = "", workdir: Path | None = None) -> Path:
    workdir = workdir or Path("/nonexistent")  # the run files a record keeps: none here
    return records.store(name, ["python", "x.py"], workdir, "out\n", stderr, wall_s=1.0, exit_code=0,
                         started="2026-01-01T00:00:00Z", machine_text="a machine", load_text="0.0", dirty="")


def _one_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


# --------------------------------------------------------------------------- --record: only its own files
def test_every_record_folder_is_marked_with_the_files_it_holds():
    """The records as committed carry their manifests, so the next --record over them works."""
    for folder in sorted(p for p in records.RESULTS.iterdir() if p.is_dir()):
        files = figures.folder.written(folder)
        assert files is not None, folder
        assert sorted(p.name for p in folder.iterdir()) == sorted([*files, figures.folder.MARKER]), folder


def test_a_record_over_a_folder_holding_a_stranger_file_is_refused_and_deletes_nothing(results, capsys):
    folder = results / "grow-demo"
    (folder / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert figures.main(["--record", "grow-demo"]) == 2  # refused before its command runs (no_command)
    line = _one_error(capsys)
    assert "grow-demo" in line and "notes.txt" in line and "did not write" in line, line
    with pytest.raises(figures.folder.RecordError, match="notes.txt"):  # and when stored by hand
        _store("grow-demo")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_an_unmarked_record_folder_is_refused_and_deletes_nothing(results, capsys):
    folder = results / "grow-demo"
    (folder / figures.folder.MARKER).unlink()
    before = sorted(p.name for p in folder.iterdir())
    assert figures.main(["--record", "grow-demo"]) == 2
    assert figures.folder.MARKER in _one_error(capsys)
    assert sorted(p.name for p in folder.iterdir()) == before


def test_a_record_replaces_exactly_the_files_the_tool_wrote(results):
    """The old record's files go (a file the marker lists and the new record lacks included),
    the new record is marked with its own, and it reads back."""
    folder = results / "grow-demo"
    (folder / "side_stdout.txt").write_text("from an older record")
    files = figures.folder.written(folder)
    outputs.mark(folder, figures.folder.MARKER, {"files": [*files, "side_stdout.txt"]})
    _store("grow-demo")
    assert sorted(p.name for p in folder.iterdir()) == [figures.folder.MARKER, "record.json", "stderr.txt",
                                                        "stdout.txt"]
    assert figures.folder.written(folder) == ["record.json", "stderr.txt", "stdout.txt"]
    assert figures.load("grow-demo")["stdout"] == "out\n"
    assert [p.name for p in results.iterdir() if p.name.startswith(".")] == []  # no folder left aside


def test_a_side_worker_s_output_joins_a_suite_record_once_and_is_quoted_with_the_wall_time(results):
    """A second worker that ran some of a suite's items beside the recorded command: its
    output becomes the record's (listed by the marker, so the next --record replaces it), its
    fine-tunings count with the command's, and the wall time is quoted with what ran beside."""
    folder = results / "paper-mini"
    (folder / "side_stdout.txt").unlink()
    rec = json.loads((folder / "record.json").read_text())
    rec.pop("beside")
    (folder / "record.json").write_text(json.dumps(rec))
    outputs.mark(folder, figures.folder.MARKER, {"files": [f for f in figures.folder.written(folder)
                                                           if f != "side_stdout.txt"]})
    before = figures.suites._suite_wall(figures.load("paper-mini"))
    side = ("[item 74] runs/ELLE/seed3: done in 137 s; final AP 113.69, gate pass\n"  # a run, not a fine-tuning
            "50%\r[item 189] runs/LOIRE/seed5 amazon_sentiment: done in 36 s; accuracy 67.78\n")
    records.attach_side("paper-mini", side, "a second worker ran one fine-tuning")
    got = figures.load("paper-mini")
    assert got["side_stdout"].endswith("\n[item 189] runs/LOIRE/seed5 amazon_sentiment: done in 36 s; accuracy 67.78\n")
    assert "side_stdout.txt" in figures.folder.written(folder)
    after = figures.suites._suite_wall(got)
    assert "a second worker ran one fine-tuning" in after and "beside" not in before
    tunes = lambda text: int(text.split(" fine-tunings")[0].rsplit(" ", 1)[1])  # noqa: E731
    assert tunes(after) == tunes(before) + 1
    with pytest.raises(records.RecordError, match="already holds a side worker's output"):
        records.attach_side("paper-mini", side, "again")
    with pytest.raises(records.RecordError, match="no comparison suite"):
        records.attach_side("grow-demo", side, "a worker")


# --------------------------------------------------------------------------- reading and reproducing records
@pytest.mark.parametrize("args", [["--reproduce", "grow-demo"], ["--reproduce", "default-run"],
                                  ["--reproduce", "paper-mini"]])
def test_reproduce_refuses_a_missing_record_before_running_anything(results, capsys, args):
    shutil.rmtree(results / args[1])
    assert figures.main(args) == 2
    assert f"{args[1]} holds no record.json" in _one_error(capsys)


def test_reproduce_refuses_a_record_of_timings_only_before_running_anything(results, capsys):
    assert figures.main(["--reproduce", "bench-data"]) == 2
    assert "timings only" in _one_error(capsys)


@pytest.mark.parametrize("file, content", [("default-run/record.json", b'{"name": "default-run",'),
                                           ("default-run/report.json", b"[1, 2"),
                                           ("default-run/stdout.txt", b"\xff\xfe not utf-8"),
                                           ("paper-mini/runs.json", b"{")])
def test_a_damaged_record_file_is_one_line_naming_it(results, capsys, file, content):
    (results / file).write_bytes(content)
    args = ["--reproduce", "paper-mini"] if file.startswith("paper-mini") else ["--check"]
    assert figures.main(args) == 2
    line = _one_error(capsys)
    assert file in line and ("not JSON" in line or "not UTF-8" in line), line


# --------------------------------------------------------------------------- first use
def test_a_first_use_record_must_show_its_corpus_built(results):
    """A first-use record whose corpus came from the cache ('ready in 0.1s') is refused and
    nothing is written; one whose log shows the domains written and the BPE trained is stored.
    A record claiming a prepared corpus is refused if its command built it."""
    folder = results / "default-run-first"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with pytest.raises(figures.folder.RecordError, match="did not build the corpus .*ready in 0.1 s"):
        _store("default-run-first", CACHED)
    with pytest.raises(figures.folder.RecordError, match="no '\\[loire_jax.data\\] ready in' line"):
        _store("default-run-first", "")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    _store("default-run-first", BUILT)
    assert figures.load("default-run-first")["stderr"] == BUILT
    with pytest.raises(figures.folder.RecordError, match="records a run with the corpus prepared, but its command "
                                                         "built it"):
        _store("default-run", BUILT)
    _store("default-run", CACHED)


def test_check_names_a_first_use_record_that_did_not_build_its_corpus_and_quotes_no_zero(results):
    """--check says so of a first-use record whose corpus came from the cache, and a figure
    that needs the build's times refuses to render rather than quote 0 s; from a record of a
    real build it quotes the logged times."""
    stderr = results / "default-run-first" / "stderr.txt"
    stderr.write_text(CACHED)
    found = figures.problems()
    assert any(line.startswith("docs/results/default-run-first records first use, but its command did not build "
                               "the corpus") for line in found), found
    assert any("figures:data-prepare cannot be rendered" in line and "training the BPE" in line for line in found)
    stderr.write_text(BUILT)
    assert "took 284.7 s, 34.8 s of it training the BPE" in " ".join(figures.render("data-prepare").split())
    assert not any("records first use" in line for line in figures.problems())


def test_a_first_use_command_runs_with_empty_corpus_and_compilation_caches(results, monkeypatch):
    """The recorder gives the command a HOME of its own, empty when the command starts and
    removed after, and no cache variable that would lead it to a warm cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere/warm")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/somewhere/warm/xla")
    seen = {}

    def command(args, **kwargs):
        env = kwargs["env"]
        home = Path(env["HOME"])
        seen.update(home=home, empty=home.is_dir() and not any(home.iterdir()), env=env)
        return subprocess.CompletedProcess(args, 0, b"", BUILT.encode())

    monkeypatch.setattr(subprocess, "run", command)
    figures.records.record("default-run-first")
    assert seen["empty"] and seen["home"] != Path.home() and not seen["home"].exists()
    assert "XDG_CACHE_HOME" not in seen["env"] and "JAX_COMPILATION_CACHE_DIR" not in seen["env"]
    assert seen["env"]["PYTHONUSERBASE"]  # the user's own packages stay importable
    assert figures.load("default-run-first")["stderr"] == BUILT


# --------------------------------------------------------------------------- --runs: a suite's spot check
def test_runs_needs_reproduce_and_a_suite_record(results, capsys):
    with pytest.raises(SystemExit) as exit_:
        figures.main(["--check", "--runs", "runs/LOIRE/seed1"])
    assert exit_.value.code == 2 and "--runs goes with --reproduce" in capsys.readouterr().err
    assert figures.main(["--reproduce", "default-run", "--runs", "runs/LOIRE/seed1"]) == 2
    assert "default-run records one command" in _one_error(capsys)


def test_runs_names_a_run_the_record_lacks_before_running_anything(results, capsys):
    assert figures.main(["--reproduce", "paper-mini", "--runs", "runs/LOIRE/seed1,runs/LOIRE/seed9"]) == 2
    line = _one_error(capsys)
    assert "holds no run runs/LOIRE/seed9;" in line and "runs/LOIRE/seed1," not in line, line


def test_runs_plans_each_named_run_as_the_suite_did():
    """A main run gets the setting the record's sweep chose and its own seed; a sweep run its
    grid point and the sweep's seed; the mesh is the suite's."""
    sweep = "sweep/lr=0.01,init_std=0.01/GPT_L"
    planned, mesh, want = figures.spot.plan("paper-mini", ["runs/LOIRE/seed4", sweep])
    (main_run, main), (sweep_run, swept) = planned
    chosen = json.loads((records.RESULTS / "paper-mini" / "suite.json").read_text())["setting"]
    assert main_run == "runs/LOIRE/seed4" and main.seed == 4 and main.name == "paper-mini-LOIRE-s4"
    assert chosen == ["optimizer.lr=0.003", "model.init_std=0.02"]
    assert (main.optimizer.lr, main.model.init_std) == (0.003, 0.02)
    assert sweep_run == sweep and swept.seed == 0 and (swept.optimizer.lr, swept.model.init_std) == (0.01, 0.01)
    assert mesh == "1" and sorted(want) == sorted(["runs/LOIRE/seed4", sweep])


def test_runs_reruns_only_the_named_runs_and_names_one_that_parts(results, monkeypatch, capsys):
    """Each named run is rerun by launch/train.py with its planned config; only those are
    compared with the record (the suite's other runs are not reported missing), and a rerun
    whose steps differ is named."""
    names = ["runs/LOIRE/seed1", "runs/GPT_L/seed2"]
    loss = {"shift": 0.0}

    def metrics(workdir: Path, seed: int) -> None:
        rows = [{"kind": "train", "stage": 1, "step": i, "loss": 5.0 - i / 100 + seed + loss["shift"],
                 "grad_norm": 1.0} for i in range(1, 201)]
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    fake = results.parent / "recorded"
    for name in names:
        metrics(fake / name, int(name[-1]))
    runs_json = json.loads((results / "paper-mini" / "runs.json").read_text())
    runs_json.update(records.suite_runs(fake))
    (results / "paper-mini" / "runs.json").write_text(json.dumps(runs_json))
    started = []

    def train(args, **kwargs):
        assert args[1] == "launch/train.py"
        config = json.loads(Path(args[args.index("--config") + 1]).read_text())
        workdir = Path(args[args.index("--workdir") + 1])
        started.append((workdir.relative_to(workdir.parents[2]).as_posix(), config["seed"]))
        metrics(workdir, config["seed"])
        return subprocess.CompletedProcess(args, 0, b"", b"")

    monkeypatch.setattr(subprocess, "run", train)
    assert figures.main(["--reproduce", "paper-mini", "--runs", ",".join(names)]) == 0
    assert started == [("runs/LOIRE/seed1", 1), ("runs/GPT_L/seed2", 2)]
    assert "every step of the named runs equals the record's" in capsys.readouterr().out
    loss["shift"] = 1e-6
    assert figures.main(["--reproduce", "paper-mini", "--runs", names[1]]) == 1
    err = capsys.readouterr().err
    assert "differs: runs/GPT_L/seed2: its steps differ from the record's" in err and "seed1" not in err, err
    # the same difference where the record's CPU model is this one's: no excuse is offered
    recorded_cpu = json.loads((results / "paper-mini" / "record.json").read_text())["machine"]
    monkeypatch.setattr(records, "cpu_model", lambda: recorded_cpu.split("-core ", 1)[1].rsplit(" x86_64", 1)[0])
    assert figures.main(["--reproduce", "paper-mini", "--runs", names[1]]) == 1
    assert "note:" not in capsys.readouterr().err


def test_a_rerun_that_differs_on_another_cpu_model_says_the_record_was_made_elsewhere(results, monkeypatch):
    """XLA's CPU kernels round differently between CPU models, so a spot check on another
    model than the record's differs in the last digits: the tool says where each was made."""
    recorded = json.loads((results / "paper-mini" / "record.json").read_text())["machine"]
    monkeypatch.setattr(records, "cpu_model", lambda: "Another CPU Model 9")
    note = records.other_cpu("paper-mini")
    assert note is not None and recorded in note and "a machine" in note and "round differently" in note
    monkeypatch.setattr(records, "cpu_model", lambda: recorded.split("-core ", 1)[1].rsplit(" x86_64", 1)[0])
    assert records.other_cpu("paper-mini") is None


def test_a_record_folder_left_by_another_tool_keeps_its_files_when_refused_at_store_time(results, monkeypatch):
    """A file that appears in the record folder while the command runs is caught when the
    record is stored: the old record and that file stay, the new record is kept aside and named."""
    folder = results / "grow-demo"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def command(args, **kwargs):
        (folder / "late.txt").write_text("written while the command ran")
        return subprocess.CompletedProcess(args, 0, b"demo\n", b"")

    monkeypatch.setattr(subprocess, "run", command)
    with pytest.raises(figures.folder.RecordError, match="late.txt.*the new record is kept in"):
        records.record("grow-demo")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == {**before, "late.txt": b"written while the command ran"}
    kept = [p for p in results.iterdir() if p.name.startswith(".grow-demo.new-")]
    assert len(kept) == 1 and (kept[0] / "stdout.txt").read_text() == "demo\n"


def test_the_corpus_check_reads_what_prepare_logs_on_a_first_build_and_on_a_cached_one(tmp_path, capsys):
    """The lines the recorder looks for are the ones ``prepare`` prints: a first build of the
    fixture corpus passes as first use, and the second prepare, from the cache, does not."""
    from loire_jax.config.loader import data_config_from_dict
    from loire_jax.data import prepare

    cfg = data_config_from_dict(tiny_config_dict(tmp_path / "cache"))
    capsys.readouterr()
    prepare(cfg, progress=True)
    first = capsys.readouterr().err
    prepare(cfg, progress=True)
    again = capsys.readouterr().err
    assert records.corpus_problems("default-run-first", first) == []
    assert records.corpus_problems("default-run", first) != []
    assert records.corpus_problems("default-run", again) == []
    assert "did not build the corpus" in records.corpus_problems("default-run-first", again)[0]


@pytest.mark.slow
def test_runs_reproduces_a_real_suite_s_runs_bit_for_bit(tmp_path, monkeypatch, capsys):
    """End to end: a micro suite (a one-point sweep, then LOIRE) run by launch/experiment.py and
    recorded; ``--runs`` reruns its main run through launch/train.py, and every step equals
    the record's: only with the setting the sweep chose, which is not the base's."""
    import yaml
    from runs import tiny_run

    config = tiny_run(tiny_config_dict(tmp_path / "data"), "micro", "1", eval={"every": 0, "batches": 1},
                      checkpoint={"save_every": 0, "keep": 1}, stages=[
                          {"name": "A", "domains": ["SCI"], "steps": 3},
                          {"name": "B", "domains": ["NEWS"], "steps": 3, "growth": [{"op": "hidden", "size": 32}],
                           "warmup_steps": 1, "teachers": "all", "replay_ratio": 0.25, "beta": 0.1, "beta_steps": 1}])
    (tmp_path / "loire.yaml").write_text(yaml.safe_dump(config))
    suite = {"name": "micro", "base": "loire.yaml", "systems": ["LOIRE"], "seeds": [1],
             "sweep": {"systems": ["LOIRE"], "seed": 0, "grid": {"optimizer.lr": [0.03]}}}
    (tmp_path / "micro.yaml").write_text(yaml.safe_dump(suite))
    command = ["python", "launch/experiment.py", "--suite", str(tmp_path / "micro.yaml"), "--workdir",
               str(tmp_path / "suite")]
    env = {**{k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, *command[1:]], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    monkeypatch.setitem(records.RECORDINGS, "micro", records.Recording(
        tuple(command), ("report/report.json", "suite.json"), "a micro suite", suite=True))
    monkeypatch.setattr(records, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(figures.spot, "RESULTS", tmp_path / "results")
    records.store("micro", command, tmp_path / "suite", done.stdout, done.stderr, wall_s=1.0, exit_code=0,
                  started="now", machine_text="a machine", load_text="0.0", dirty="")
    assert json.loads((tmp_path / "results" / "micro" / "suite.json").read_text())["setting"] == ["optimizer.lr=0.03"]
    assert sorted(json.loads((tmp_path / "results" / "micro" / "runs.json").read_text())) == [
        "runs/LOIRE/seed1", "sweep/lr=0.03/LOIRE"]
    assert figures.main(["--reproduce", "micro", "--runs", "runs/LOIRE/seed1"]) == 0, capsys.readouterr().err
    assert "every step of the named runs equals the record's" in capsys.readouterr().out
