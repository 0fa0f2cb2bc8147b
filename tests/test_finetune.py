"""End to end: ``loire-finetune`` on a finished stage of a decoder run and of an encoder run.

Specifications:
- an untrained head scores at chance on a balanced task (within 5 points over 400 examples);
- a task whose label is a function of one word is learned (≥ 99% validation accuracy), by a
  decoder (last-token pooling) and by an encoder ([CLS] pooling, text pairs with token types);
- multiple choice and extractive QA train and score through the same command;
- a job stopped by SIGTERM or killed by SIGKILL resumes and reproduces the uninterrupted job's
  losses and scores bit for bit; a finished job is not redone;
- two processes fine-tune as one process does on the same mesh;
- bad input is one line, exit 2, and nothing is written;
- a finished or stopped job is reused or resumed only while the checkpoint and data it
  records still hold: after a --fresh retrain, a swapped stage checkpoint or flipped
  labels, the old job is moved aside and the current model and data are scored; the
  report leaves the old score out; one writer per job (a held lock refuses a second);
  a damaged results.json is one line naming it.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from runs import ROOT, in_process, one_line_error, tiny_run

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("finetune")]

WORDS = ("alpha beta gamma delta river stone cloud paper green small quick table window music light "
         "garden yellow silver market winter").split()


def _run(base: Path, name: str, encoder: bool) -> Path:
    from data_helpers import tiny_config_dict

    # One device: the learning jobs below train 120 steps and more, and on 2 cores each took about 1.5
    # times as long over 2. Jobs over 2 devices: the resume tests' (--mesh 2) and the two-process test's.
    config = tiny_run(tiny_config_dict(base / "data"), name, "1", eval={"every": 0, "batches": 1}, stages=[
        {"name": "A", "domains": ["SCI"], "steps": 2}, {"name": "B", "domains": ["NEWS"], "steps": 2,
                                                       "growth": [{"op": "layers", "size": 2}]}])
    config["model"] = {**config["model"], "max_seq_len": 64}
    if encoder:
        config["model"] = {**config["model"], "preset": "bert", "vocab_size": 322}
    path = base / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    workdir = base / name
    assert in_process(path, workdir).complete
    return workdir


@pytest.fixture(scope="module")
def decoder_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("ft-decoder"), "ft-dec", encoder=False)


@pytest.fixture(scope="module")
def encoder_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("ft-encoder"), "ft-enc", encoder=True)


def _write(folder: Path, name: str, rows: list[dict]) -> str:
    path = folder / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return name


def word_task(folder: Path, n_train: int = 320, n_valid: int = 400, pair: bool = False, seed: int = 0,
              n_words: int = 3, **hyper) -> Path:
    """Balanced: label "yes" iff the marker "!" (one token of the fixture BPE, which spells the
    words of WORDS letter by letter) is in the text (or, for pairs, in the second text)."""
    rng = random.Random(seed)

    def row(i: int) -> dict:
        words = [rng.choice(WORDS) for _ in range(n_words)]
        yes = i % 2 == 0
        if yes:
            words[rng.randrange(n_words)] = "!"
        text = " ".join(words)
        if pair:
            return {"premise": " ".join(rng.choice(WORDS) for _ in range(4)), "hypothesis": text,
                    "label": "yes" if yes else "no"}
        return {"sentence": text, "label": "yes" if yes else "no"}

    train = _write(folder, "train.jsonl", [row(i) for i in range(n_train)])
    valid = _write(folder, "valid.jsonl", [row(i) for i in range(n_valid)])
    fields = {"text": "premise", "text_pair": "hypothesis"} if pair else {"text": "sentence"}
    config = {"task": {"name": "marker", "kind": "classification", "source": "local",
                       "files": {"train": train, "validation": valid}, "fields": fields, "labels": ["no", "yes"]},
              "max_len": 64, "lr": 1.0e-2, "batch_size": 16, "epochs": 6, "weight_decay": 0.0, **hyper}
    path = folder / "marker.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def finetune_cli(run_dir: Path, task: Path, *args: str, fault: str | None = None, timeout: int = 600,
                 env: dict[str, str] | None = None):
    env = {**{k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}, "JAX_PLATFORMS": "cpu", **(env or {})}
    entry = [str(ROOT / "tests" / "finetune_fault_driver.py"), fault] if fault else \
        [str(ROOT / "launch" / "finetune.py")]
    cmd = [sys.executable, *entry, str(run_dir), "--task", str(task), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def in_process_finetune(run_dir: Path, task: Path, *overrides: str, **kw):
    from runs import run_numerics

    from loire_jax.downstream.finetune import finetune

    with run_numerics():
        return finetune(run_dir, str(task), overrides=overrides, log=lambda line: None, **kw)


def test_an_untrained_head_scores_at_chance_on_a_balanced_task(decoder_run, tmp_path):
    result = in_process_finetune(decoder_run, word_task(tmp_path), "epochs=0", "tag=untrained", seeds=[1, 2])
    for seed in result.seeds:
        assert seed.epochs == [seed.epochs[0]] and seed.epochs[0]["step"] == 0
        assert abs(seed.score - 50.0) <= 5.0, seed.score


def test_a_decoder_learns_a_one_word_rule(decoder_run, tmp_path):
    result = in_process_finetune(decoder_run, word_task(tmp_path))
    assert result.complete and result.seeds[0].score >= 99.0, result.seeds[0].epochs
    out = decoder_run / "finetune" / "marker" / "stage2"
    saved = json.loads((out / "seed1" / "results.json").read_text())
    assert saved["score"] == result.seeds[0].score and saved["train_examples"] == 320
    assert json.loads((out / "summary.json").read_text())["mean"] == result.seeds[0].score


def test_an_encoder_learns_a_one_word_rule_in_the_second_text_of_a_pair(encoder_run, tmp_path):
    result = in_process_finetune(encoder_run, word_task(tmp_path, pair=True))
    assert result.seeds[0].score >= 99.0, result.seeds[0].epochs


def test_multiple_choice_picks_the_choice_with_the_marker(encoder_run, decoder_run, tmp_path):
    rng = random.Random(1)

    def row() -> dict:
        choices = [" ".join(rng.choice(WORDS) for _ in range(3)) for _ in range(3)]
        answer = rng.randrange(3)
        choices[answer] += " !"
        return {"question": "which one", "options": choices, "answer": answer}

    _write(tmp_path, "train.jsonl", [row() for _ in range(320)])
    _write(tmp_path, "valid.jsonl", [row() for _ in range(200)])
    (tmp_path / "mc.yaml").write_text(yaml.safe_dump({
        "task": {"name": "mc", "kind": "multiple_choice", "source": "local",
                 "files": {"train": "train.jsonl", "validation": "valid.jsonl"},
                 "fields": {"text": "question", "choices": "options", "label": "answer"}},
        "max_len": 32, "lr": 1.0e-2, "batch_size": 16, "epochs": 6, "weight_decay": 0.0}))
    for run in (decoder_run, encoder_run):
        result = in_process_finetune(run, tmp_path / "mc.yaml")
        assert result.seeds[0].score >= 95.0, (run.name, result.seeds[0].epochs)


def qa_task(folder: Path, **hyper) -> Path:
    """SQuAD 2.0 style: the answer is the word "zz" where the context has it; a third of the
    contexts have none (unanswerable)."""
    rng = random.Random(2)

    def row(i: int) -> dict:
        words = [rng.choice(WORDS) for _ in range(5)]
        if i % 3 == 0:
            return {"id": f"q{i}", "question": "where", "context": " ".join(words), "answers": []}
        k = rng.randrange(5)
        words[k] = "zz"
        start = len(" ".join(words[:k])) + (1 if k else 0)
        return {"id": f"q{i}", "question": "where", "context": " ".join(words),
                "answers": [{"text": "zz", "start": start}]}

    _write(folder, "train.jsonl", [row(i) for i in range(480)])
    _write(folder, "valid.jsonl", [row(i) for i in range(150)])
    path = folder / "qa.yaml"
    path.write_text(yaml.safe_dump({
        "task": {"name": "qa", "kind": "qa", "source": "local", "metric": "squad",
                 "files": {"train": "train.jsonl", "validation": "valid.jsonl"}},
        "max_len": 48, "lr": 1.0e-2, "batch_size": 16, "epochs": 8, "weight_decay": 0.0, **hyper}))
    return path


def test_extractive_qa_learns_spans_and_no_answers_across_windows(encoder_run, tmp_path):
    """max_len 24 leaves a window about 16 context tokens: most contexts take two or three
    overlapping windows, and the answer is found in whichever holds it."""
    task = qa_task(tmp_path, max_len=24, doc_stride=8)
    untrained = in_process_finetune(encoder_run, task, "epochs=0", "tag=untrained").seeds[0].epochs[-1]
    trained = in_process_finetune(encoder_run, task)
    saved = json.loads((trained.seeds[0].directory / "results.json").read_text())
    assert saved["validation_examples"] == 150 and saved["windows"]["validation"] > 225, saved["windows"]
    best = trained.seeds[0].epochs[-1]
    assert untrained["f1"] < 50.0 <= 90.0 <= min(best["f1"], best["exact_match"]), (untrained, best)


def _resume_task(folder: Path, tag: str) -> Path:
    return word_task(folder, epochs=2, save_every=6, tag=tag)


RESUME_ARGS = ("--seeds", "3", "--mesh", "2")  # a sharded job is stopped and resumed


@pytest.fixture(scope="module")
def uninterrupted_job(decoder_run, tmp_path_factory):
    """The job the stopped ones are held to, run once by the CLI: its results (the tag names
    the job's directory only)."""
    task = _resume_task(tmp_path_factory.mktemp("ft-resume"), "whole")
    reference = finetune_cli(decoder_run, task, *RESUME_ARGS)
    assert reference.returncode == 0, reference.stderr[-3000:]
    report = (decoder_run / "report" / "report.md").read_text()  # the run's report gains the job
    assert f"report: {decoder_run / 'report' / 'report.md'}" in reference.stdout
    assert "marker-whole (M2)" in report.split("## Downstream (Table 5)")[1], report[-2000:]
    return json.loads((decoder_run / "finetune" / "marker-whole" / "stage2" / "seed3" / "results.json").read_text())


@pytest.mark.parametrize("fault", ["term:13", "kill:31"])
def test_a_stopped_job_resumes_and_reproduces_the_uninterrupted_one(decoder_run, uninterrupted_job, tmp_path, fault):
    """save_every 6: SIGTERM after step 13 saves step 13 and exits 75; SIGKILL after step 31
    loses it and whatever save was in flight, and the rerun resumes from the newest complete one.
    Either way every loss and score equals the uninterrupted job's."""
    tag = fault.split(":")[0]
    task = _resume_task(tmp_path, tag)
    out = decoder_run / "finetune" / f"marker-{tag}" / "stage2" / "seed3"
    stopped = finetune_cli(decoder_run, task, *RESUME_ARGS, fault=fault)
    assert stopped.returncode == (75 if fault.startswith("term") else -9), stopped.stderr[-3000:]
    assert not (out / "results.json").exists()
    resumed = finetune_cli(decoder_run, task, *RESUME_ARGS)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    at = re.search(r"resumed at step (\d+) of 40", resumed.stdout)
    # SIGKILL may land while step 30's save is still being written: then step 24 is the newest
    assert at and int(at.group(1)) in ((13,) if tag == "term" else (24, 30)), resumed.stdout
    got = json.loads((out / "results.json").read_text())
    assert got["train"] == uninterrupted_job["train"] and got["epochs"] == uninterrupted_job["epochs"]
    if tag == "term":  # a finished job is not redone (once is enough: the same code path for both)
        again = finetune_cli(decoder_run, task, *RESUME_ARGS)
        assert again.returncode == 0 and "done earlier" in again.stdout


def test_two_processes_fine_tune_as_one_process_does(decoder_run, tmp_path):
    """Two local processes of one device each (loire-train's flags, a loopback coordinator)
    make the mesh data=2 that one process makes of its two devices: the same losses and
    score, one writer, one voice."""
    task = word_task(tmp_path, epochs=1, tag="procs")
    one = finetune_cli(decoder_run, task, "--seeds", "4", "--mesh", "data=2")
    assert one.returncode == 0, one.stderr[-3000:]
    out = decoder_run / "finetune" / "marker-procs" / "stage2"
    want = json.loads((out / "seed4" / "results.json").read_text())
    for p in sorted(out.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**{k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}, "JAX_PLATFORMS": "cpu"}
    procs = [subprocess.Popen([sys.executable, str(ROOT / "launch" / "finetune.py"), str(decoder_run), "--task",
                               str(task), "--seeds", "4", "--mesh", "2", "--coordinator", f"127.0.0.1:{port}",
                               "--num-processes", "2", "--process-id", str(i)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    with ThreadPoolExecutor(2) as pool:  # both pipes drained at once
        (out0, err0), (out1, err1) = pool.map(lambda p: p.communicate(timeout=600), procs)
    assert [p.returncode for p in procs] == [0, 0], (err0[-3000:], err1[-3000:])
    assert "over 2 processes (1 local each)" in out0 and "accuracy" in out0
    assert [line for line in out1.splitlines() if not line.startswith("[Gloo]")] == []  # Gloo's own C++ chatter aside
    got = json.loads((out / "seed4" / "results.json").read_text())
    assert [r["step"] for r in got["train"]] == [r["step"] for r in want["train"]]
    for a, b in zip(got["train"], want["train"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), (a, b)
    assert got["score"] == pytest.approx(want["score"], abs=1e-9)
    assert json.loads((out / "summary.json").read_text())["mean"] == got["score"]


def test_several_tasks_run_in_turn_after_every_task_is_checked(decoder_run, tmp_path):
    """Two --task: a bad record in the second task's file fails before the first computes
    (nothing written); fixed, both run and the report lists both. Every task is checked
    before any job's folder is read: a task invalid on this model is refused as such, even
    where an earlier task's stored job holds other settings."""
    tasks = []
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        path = word_task(tmp_path / name, n_train=32, n_valid=32, epochs=1, max_len=16)
        config = yaml.safe_load(path.read_text())
        config["task"]["name"] = f"marker-{name}"
        path.write_text(yaml.safe_dump(config))
        tasks += ["--task", str(path)]
    good = (tmp_path / "second" / "valid.jsonl").read_text()
    (tmp_path / "second" / "valid.jsonl").write_text(json.dumps({"sentence": "a b", "label": "maybe"}) + "\n")
    before = {str(p) for p in decoder_run.rglob("*")}
    result = finetune_cli(decoder_run, Path(tasks[1]), *tasks[2:])
    assert "second/valid.jsonl, line 1: label 'maybe' is not one of the declared labels" in one_line_error(result)
    _nothing_written(decoder_run, before)
    (tmp_path / "second" / "valid.jsonl").write_text(good)
    result = finetune_cli(decoder_run, Path(tasks[1]), *tasks[2:])
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("first", "second"):
        assert (decoder_run / "finetune" / f"marker-{name}" / "stage2" / "seed1" / "results.json").is_file()
        assert f"marker-{name} on stage 2: accuracy" in result.stdout
    # both files changed: the first's settings (its stored job holds others), the second's
    # invalid on this model; the second task's own error comes first, not "holds a job with
    # other settings", and nothing is written
    for name, change in (("first", {"lr": 3.0e-3}), ("second", {"pooling": "first"})):
        path = tmp_path / name / "marker.yaml"
        path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), **change}))
    before = {str(p) for p in decoder_run.rglob("*")}
    result = finetune_cli(decoder_run, Path(tasks[1]), *tasks[2:])
    assert "pooling 'first' cannot work on a decoder" in one_line_error(result)
    _nothing_written(decoder_run, before)


def _nothing_written(run_dir: Path, before: set) -> None:
    assert {str(p) for p in run_dir.rglob("*")} == before


@pytest.mark.parametrize("case, expect", [
    ("missing-column", "has no column 'sentence'"),
    ("unknown-label", "label 'maybe' is not one of the declared labels"),
    ("empty-split", "the validation split"),
    ("unknown-task", "is neither a file nor a shipped preset"),
    ("first-on-decoder", "pooling 'first' cannot work on a decoder"),
    ("unfinished-stage", "has not finished"),
    ("bad-override", "lr must be positive"),
    ("max_len-above-the-model", "max_len 128 exceeds the model's max_seq_len 64; set max_len=64"),
])
def test_bad_input_is_one_line_and_writes_nothing(decoder_run, tmp_path, case, expect):
    task = word_task(tmp_path)
    args: list[str] = []
    run_dir = decoder_run
    if case == "missing-column":
        (tmp_path / "train.jsonl").write_text(json.dumps({"text": "a b", "label": "yes"}) + "\n")
    elif case == "unknown-label":
        (tmp_path / "valid.jsonl").write_text(json.dumps({"sentence": "a b", "label": "maybe"}) + "\n")
    elif case == "empty-split":
        (tmp_path / "valid.jsonl").write_text("\n")
    elif case == "unknown-task":
        task = Path("no-such-task")
    elif case == "first-on-decoder":
        args = ["pooling=first"]
    elif case == "unfinished-stage":
        run_dir = tmp_path / "partial"
        run_dir.mkdir()
        config = json.loads((decoder_run / "config.json").read_text())
        (run_dir / "config.json").write_text(json.dumps(config))
    elif case == "bad-override":
        args = ["lr=-1"]
    elif case == "max_len-above-the-model":  # given on the command line: refused naming the fix, not changed
        args = ["max_len=128"]
    before = {str(p) for p in run_dir.rglob("*")}
    result = finetune_cli(run_dir, task, *args)
    assert expect in one_line_error(result)
    _nothing_written(run_dir, before)


# ----------------------------------------------------------------------------- a result is reused only while true
def _small_task(folder: Path, **hyper) -> Path:
    """64 / 48 examples; epochs 0 (the untrained head's score, which the backbone and the
    data decide as a trained one does) unless told: no train step to compile."""
    folder.mkdir(parents=True, exist_ok=True)
    return word_task(folder, n_train=64, n_valid=48, **{"epochs": 0, **hyper})


def _flip_labels(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**r, "label": "no" if r["label"] == "yes" else "yes"}) + "\n" for r in rows))


def _logged(run_dir: Path, task: Path, *overrides: str, **kw):
    lines: list[str] = []
    from runs import run_numerics

    from loire_jax.downstream.finetune import finetune

    with run_numerics():
        return finetune(run_dir, str(task), overrides=overrides, log=lines.append, **kw), lines


def test_a_result_is_reused_only_for_the_checkpoint_it_scored(decoder_run, tmp_path, capsys):
    """The reported case: R fine-tuned, then retrained with --fresh and another seed. --fresh
    moves finetune/ aside and says so; and old results put back beside the new model are
    caught by the fine-tuning itself: the old result is moved aside (kept), the new model is
    scored, and the report never shows the old score as the current model's."""
    import shutil

    from loire_jax.analysis.reports import write_report
    from loire_jax.store.checkpoints import stage_digest

    run = tmp_path / "R"
    shutil.copytree(decoder_run, run, ignore=shutil.ignore_patterns("finetune", "report"))
    task = _small_task(tmp_path / "task")
    first, _ = _logged(run, task)
    job = run / "finetune" / "marker" / "stage2"
    scored = json.loads((job / "seed1" / "results.json").read_text())
    assert scored["provenance"]["checkpoint"] == {"stage": 2, "step": 2, "digest": stage_digest(run, 2)}
    assert set(scored["provenance"]["data"]) == {"train", "validation"}

    retrained = tmp_path / "R2"
    shutil.copytree(run, retrained)
    capsys.readouterr()
    assert in_process(decoder_run.parent / "ft-dec.yaml", retrained, "seed=1", fresh=True).complete
    said = [line for line in capsys.readouterr().out.splitlines() if "--fresh" in line]
    assert len(said) == 1 and "moved finetune/ aside to finetune.stale-1/" in said[0], said
    assert not (retrained / "finetune").exists()
    assert json.loads((retrained / "finetune.stale-1" / "marker" / "stage2" / "seed1" / "results.json")
                      .read_text()) == scored
    assert stage_digest(retrained, 2) != stage_digest(run, 2)

    # the old results copied back beside the retrained model (a stage checkpoint of another
    # run swapped in is refused before this: store.provenance, tests/test_outputs.py)
    shutil.copytree(run / "finetune", retrained / "finetune")
    report = (write_report([retrained], checkpoint_digest=stage_digest) / "report.md").read_text()
    table = report.split("## Downstream (Table 5)")[1]
    assert f"{first.seeds[0].score:.2f}" not in table.split("Left out")[0] and "marker (M2) seed 1" in table, table

    job = retrained / "finetune" / "marker" / "stage2"
    again, lines = _logged(retrained, task)
    assert not again.seeds[0].skipped and not any("done earlier" in line for line in lines), lines
    assert any("seed 1: the stage 2 checkpoint changed since it was scored; moved that job to "
               f"{job / 'seed1.stale-1'}; recomputing" in line for line in lines), lines
    rescored = json.loads((job / "seed1" / "results.json").read_text())
    assert rescored["provenance"]["checkpoint"]["digest"] == stage_digest(retrained, 2)
    assert json.loads((job / "seed1.stale-1" / "results.json").read_text()) == scored  # kept, aside
    assert _logged(retrained, task)[0].seeds[0].skipped  # and the new result holds: reused


def test_changed_task_data_is_scored_anew_and_never_mixed_into_a_resumed_job(decoder_run, tmp_path):
    """Labels flipped after a job finished: recomputed, the old job kept aside. Flipped
    between a crash and the resume: the job starts over on the new data, and its losses and
    scores are those of an uninterrupted job on the new data (nothing of the old data in it)."""
    task = _small_task(tmp_path / "done", tag="data")
    first, _ = _logged(decoder_run, task)
    _flip_labels(tmp_path / "done" / "valid.jsonl")
    again, lines = _logged(decoder_run, task)
    assert not again.seeds[0].skipped, lines
    assert any(f"the validation data ({tmp_path / 'done' / 'valid.jsonl'}) changed since it was scored" in line
               for line in lines), lines
    job = decoder_run / "finetune" / "marker-data" / "stage2"
    assert (job / "seed1.stale-1" / "results.json").is_file()

    class Crash(Exception):
        pass

    def crash(step: int) -> None:
        if step == 7:
            raise Crash

    task = _small_task(tmp_path / "stopped", epochs=2, save_every=2, tag="resume")  # 4 steps an epoch
    with pytest.raises(Crash):
        _logged(decoder_run, task, on_step=crash)
    job = decoder_run / "finetune" / "marker-resume" / "stage2" / "seed1"
    assert not (job / "results.json").exists() and (job / "checkpoints" / "6").is_dir()
    _flip_labels(tmp_path / "stopped" / "train.jsonl")
    resumed, lines = _logged(decoder_run, task)
    assert not any("resumed at step" in line for line in lines), lines
    assert any("the train data" in line and "changed since this job began" in line for line in lines), lines
    got = json.loads((job / "results.json").read_text())
    uninterrupted, _ = _logged(decoder_run, task, "tag=resume-ref")
    want = json.loads((uninterrupted.seeds[0].directory / "results.json").read_text())
    assert got["train"] == want["train"] and got["epochs"] == want["epochs"]
    assert got["provenance"] == want["provenance"]


def test_one_writer_per_job(decoder_run, tmp_path):
    """A second fine-tuning of the same job while one holds it (here: a lock held in this
    process, as a concurrent call's would be) is refused in one line, exit 2, and writes
    nothing; the checks that follow run under the lock, so two calls never both pass them."""
    from loire_jax.errors import exit_code
    from loire_jax.store.workdir import WorkdirError, WorkdirLock

    task = _small_task(tmp_path, tag="lock")
    root = decoder_run / "finetune" / "marker-lock" / "stage2"
    root.mkdir(parents=True)
    held = WorkdirLock(root)
    held.acquire()
    try:
        with pytest.raises(WorkdirError) as err:
            _logged(decoder_run, task, "lr=3e-3")
        message = str(err.value)
        assert f"fine-tuning job {root} is in use by pid {os.getpid()}" in message and "\n" not in message
        assert f"delete {root / '.lock'}" in message and "--break-lock" not in message, message
        assert exit_code(err.value) == 2
        assert sorted(p.name for p in root.iterdir()) == [".lock"]
    finally:
        held.release()
    assert _logged(decoder_run, task, "lr=3e-3")[0].complete
    assert not (root / ".lock").exists()


@pytest.mark.parametrize("text", ["{", '{"score": 50.0}'])
def test_a_damaged_results_file_is_one_line_naming_it(decoder_run, tmp_path, text):
    from loire_jax.downstream import FinetuneError

    task = _small_task(tmp_path, tag="damaged")
    job = decoder_run / "finetune" / "marker-damaged" / "stage2" / "seed1"
    job.mkdir(parents=True, exist_ok=True)
    (job / "results.json").write_text(text)
    with pytest.raises(FinetuneError) as err:
        _logged(decoder_run, task)
    assert str(job / "results.json") in str(err.value) and "is damaged" in str(err.value)
    assert (job / "results.json").read_text() == text


def test_a_task_max_len_above_the_model_is_fitted_and_said_with_progress_and_the_baseline(decoder_run, tmp_path):
    """The README's case: a task file's max_len (here 128) longer than the model's 64 is the
    task's default, so the job reads 64 positions and says so in its first line; progress
    lines (off a terminal) come from the first step with an ETA; the trivial baseline is
    printed, recorded in results.json and shown beside the score."""
    task = word_task(tmp_path, n_train=32, n_valid=32, epochs=2, max_len=128, batch_size=16)
    done = finetune_cli(decoder_run, task, "tag=fit", env={"LOIRE_PROGRESS": "lines"})
    assert done.returncode == 0, done.stderr[-2000:]
    first = next(line for line in done.stdout.splitlines() if line.startswith("fine-tuning stage"))
    assert first.endswith("; max_len 64, the model's max_seq_len (the task's default 128 is longer)"), first
    assert re.search(r"^  seed 1: step 1/4 \(25%\), first step in \d+ s$", done.stdout, re.M), done.stdout
    assert re.search(r"^  seed 1: step 4/4 \(100%\), [\d.]+ s/step, ETA 0 s$", done.stdout, re.M), done.stdout
    saved = json.loads((decoder_run / "finetune" / "marker-fit" / "stage2" / "seed1" / "results.json").read_text())
    assert saved["config"]["max_len"] == 64
    assert saved["baseline"] == {"name": "majority class", "answer": "always 'no'", "score": 50.0, "n": 32,
                                 "noise": 17.6777}
    assert "  trivial baseline: always 'no' scores 50.00 (majority class; noise ± 17.68 over 32 validation " \
           "examples)" in done.stdout
    assert "; trivial baseline 50.00 ± 17.68" in done.stdout
