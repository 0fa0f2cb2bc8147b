"""Specification: a suite on a cluster, one planned item per index.

The plan numbers a suite's items in a stable order (sweep runs, the choice, main runs,
fine-tunings, the report); an index comes from ``--index``, a SLURM array task or a
Kubernetes Indexed Job; ``--status`` says where each item stands, from the workdir's
records, without writing or locking anything; ``--merge`` refuses a source that is not
the run the plan holds there before anything is copied. All in process, on fabricated
records: the runs themselves are tests/test_experiment.py's (slow tier)."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time

import pytest
import yaml
from data_helpers import tiny_config_dict
from runs import ROOT, micro_loire

from loire_jax import outputs
from loire_jax.errors import ConfigError
from loire_jax.experiments import plan as plans
from loire_jax.experiments import records
from loire_jax.experiments import suite as suites
from loire_jax.experiments.status import states


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    """A suite of every phase: a two-point sweep on LOIRE, GPT_L and LOIRE at seeds 1 and 2, a
    fine-tuning of LOIRE's runs on a local task, the report."""
    base = tmp_path_factory.mktemp("plan")
    config = micro_loire(tiny_config_dict(base / "data"))
    (base / "loire.yaml").write_text(yaml.safe_dump(config))
    for split, words in (("train", "abcdefgh"), ("valid", "ijkl")):
        (base / f"{split}.jsonl").write_text("".join(json.dumps({"text": w, "label": ["no", "yes"][i % 2]}) + "\n"
                                                     for i, w in enumerate(words)))
    (base / "task.yaml").write_text(yaml.safe_dump({
        "task": {"name": "tiny-task", "kind": "classification", "source": "local", "labels": ["no", "yes"],
                 "files": {"train": "train.jsonl", "validation": "valid.jsonl"}},
        "max_len": 16, "batch_size": 8, "epochs": 1, "lr": 1.0e-3}))
    suite = {"name": "micro", "base": "loire.yaml", "systems": ["GPT_L", "LOIRE"], "seeds": [1, 2],
             "sweep": {"systems": ["LOIRE"], "seed": 0, "grid": {"optimizer.lr": [0.01, 0.03]}},
             "downstream": {"tasks": [str(base / "task.yaml")], "systems": ["LOIRE"]}}
    (base / "micro.yaml").write_text(yaml.safe_dump(suite))
    return base / "micro.yaml"


def one_line(capsys, argv: list[str], code: int = 2) -> str:
    from loire_jax.cli.experiment import main

    assert main(argv) == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def snapshot(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- the plan's numbers
def test_the_plan_numbers_sweep_choice_main_finetune_report_in_the_suites_own_order(micro):
    suite = suites.load_suite(str(micro))
    plan = plans.items(suite)
    assert plans.phase_ranges(plan) == [("sweep", 0, 1), ("choice", 2, 2), ("main", 3, 6), ("finetune", 7, 8),
                                        ("report", 9, 9)]
    assert [i.index for i in plan] == list(range(10))
    # the sweep's and the main runs' folders in the order the one-process suite runs them
    assert [i.workdir for i in plan if i.phase == "sweep"] == [p.workdir for p in suites.sweep_runs(suite)]
    main = suites.main_runs(suite, ("optimizer.lr=0.03",))
    assert [(i.workdir, i.system, i.seed) for i in plan if i.phase == "main"] == \
        [(p.workdir, p.system, p.seed) for p in main]
    assert [(i.workdir, i.task) for i in plan if i.phase == "finetune"] == \
        [(p.workdir, t) for p, t in suites.downstream_jobs(suite, main)]
    # what each waits for
    assert plan[2].needs == (0, 1) and all(i.needs == (2,) for i in plan[3:7])
    assert plan[7].needs == (4,) and plan[8].needs == (6,)  # LOIRE's runs at seeds 1 and 2
    assert plan[9].needs == (3, 4, 5, 6, 7, 8)
    assert plans.items(suite) == plan  # a pure function of the suite


def test_a_suite_without_a_sweep_has_no_choice_and_the_shipped_suites_number_as_their_arrays_need():
    probe = plans.items(suites.load_suite("paper-gpu-probe"))
    assert plans.phase_ranges(probe) == [("main", 0, 11), ("report", 12, 12)]  # 4 systems x seeds 1, 2, 3
    assert all(i.needs == () for i in probe if i.phase == "main")
    assert [i.seed for i in probe[:12]] == [1] * 4 + [2] * 4 + [3] * 4  # one seed a device call: items 0-3, 4-7, 8-11
    paper = plans.items(suites.load_suite("paper"))
    # 29 systems (every windowed one under both readings) x 3 seeds, then 15 of them at seeds 4 and 5
    assert plans.phase_ranges(paper) == [("sweep", 0, 5), ("choice", 6, 6), ("main", 7, 123), ("report", 124, 124)]
    # the extra seeds come after every system's first seeds: a suite cut short has whole seeds
    assert [i.seed for i in paper if i.phase == "main"][-30:] == [4] * 15 + [5] * 15


def test_plan_prints_each_phases_range_and_array_size_then_every_item(micro, capsys):
    from loire_jax.cli.experiment import main

    assert main(["--suite", str(micro), "--plan"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "suite micro: 10 planned items, numbered 0-9"
    assert out[1:6] == ["phase sweep 0-1 (2 array tasks)", "phase choice 2-2 (1 array task)",
                        "phase main 3-6 (4 array tasks)", "phase finetune 7-8 (2 array tasks)",
                        "phase report 9-9 (1 array task)"]
    assert out[9].split() == ["3", "main", "runs/GPT_L/seed1", "GPT_L", "at", "seed", "1,", "after", "item", "2",
                              "(the", "choice)"]
    assert len(out) == 6 + 10


# --------------------------------------------------------------------------- indices
@pytest.mark.parametrize("text,want", [("3", [3]), ("0-5", [0, 1, 2, 3, 4, 5]), ("0-2,8", [0, 1, 2, 8]),
                                       (" 7 ", [7])])
def test_an_index_a_range_or_a_list(text, want):
    assert plans.parse_indices(text) == want


@pytest.mark.parametrize("text", ["", "a", "-1", "5-3", "1,,2", "1.5"])
def test_anything_else_is_refused_naming_where_it_came_from(text):
    with pytest.raises(ConfigError, match=r"^\$SLURM_ARRAY_TASK_ID takes an index"):
        plans.parse_indices(text, "$SLURM_ARRAY_TASK_ID")


def test_the_index_comes_from_the_flag_then_slurm_then_kubernetes():
    env = {"SLURM_ARRAY_TASK_ID": "4", "JOB_COMPLETION_INDEX": "9"}
    assert plans.requested("2", env) == ([2], "--index")
    assert plans.requested(None, env) == ([4], "$SLURM_ARRAY_TASK_ID")
    assert plans.requested(None, {"JOB_COMPLETION_INDEX": "9"}) == ([9], "$JOB_COMPLETION_INDEX")
    assert plans.requested(None, {"SLURM_ARRAY_TASK_ID": " "}) is None  # set but empty: no index
    assert plans.requested(None, {}) is None  # the whole suite


def test_a_phase_counts_its_index_from_its_first_item(micro):
    suite = suites.load_suite(str(micro))
    plan = plans.items(suite)
    assert [i.index for i in plans.resolve(plan, [0, 3], "$JOB_COMPLETION_INDEX", suite, "main")] == [3, 6]
    with pytest.raises(plans.PlanError, match=r"\$JOB_COMPLETION_INDEX 4 is outside phase main of suite 'micro', "
                                              r"whose 4 item\(s\) are counted 0-3 \(items 3-6 of the plan\)"):
        plans.resolve(plan, [4], "$JOB_COMPLETION_INDEX", suite, "main")


def test_an_index_outside_the_plan_is_one_line_and_nothing_is_made(micro, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    line = one_line(capsys, ["--suite", str(micro), "--workdir", str(tmp_path / "w"), "--index", "3,10-12"])
    assert line == ("error: --index 10-12 is outside the plan of suite 'micro', whose 10 items are numbered 0-9; "
                    "python launch/experiment.py --suite micro --plan lists them")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "99")
    assert "$SLURM_ARRAY_TASK_ID 99 is outside the plan" in one_line(
        capsys, ["--suite", str(micro), "--workdir", str(tmp_path / "w")])
    assert not (tmp_path / "w").exists()


def test_a_main_run_before_the_choice_says_what_it_waits_for_and_touches_nothing(micro, tmp_path, capsys):
    line = one_line(capsys, ["--suite", str(micro), "--workdir", str(tmp_path / "w"), "--index", "4"])
    assert line.startswith("error: item 4 (main runs/LOIRE/seed1) waits for the sweep's choice, item 2: ")
    assert not (tmp_path / "w").exists()


# --------------------------------------------------------------------------- one plan per workdir
def test_another_suite_file_or_seed_list_on_a_workdir_is_refused_and_changes_nothing(micro, tmp_path, capsys):
    root = tmp_path / "w"
    root.mkdir()
    (root / outputs.EXPERIMENT).write_text("{}")
    suite = suites.load_suite(str(micro))
    plans.check_binding(root, suite, str(micro), write=True)
    plans.check_binding(root, suite, str(micro), write=True)  # the same plan: fine, as often as asked
    before = snapshot(root)
    line = one_line(capsys, ["--suite", str(micro), "--seeds", "1,2,3", "--workdir", str(root), "--index", "0"])
    assert line.startswith(f"error: workdir {root} holds the plan of suite 'micro' from {micro}, and this command "
                           "gives another (seeds: [1, 2] there, [1, 2, 3] here")
    other = micro.with_name("other.yaml")
    other.write_text(micro.read_text().replace("GPT_L", "GPT_S"))
    assert "systems: ['GPT_L', 'LOIRE'] there, ['GPT_S', 'LOIRE'] here; from " + str(other) in one_line(
        capsys, ["--suite", str(other), "--workdir", str(root), "--status"])
    assert snapshot(root) == before


# --------------------------------------------------------------------------- --status
def _root(micro, tmp_path):
    """A suite's workdir with its plan bound and the sweep's choice made."""
    suite = suites.load_suite(str(micro))
    root = tmp_path / "suite"
    root.mkdir(parents=True)
    (root / outputs.EXPERIMENT).write_text("{}")
    plans.check_binding(root, suite, str(micro), write=True)
    (root / "suite.json").write_text(json.dumps({"suite": "micro", "setting": ["optimizer.lr=0.01"], "why": "test",
                                                 "grid": [["optimizer.lr=0.01"], ["optimizer.lr=0.03"]]}))
    return suite, root


def _fabricate(root, planned, *, train=(), made=None, lock=False):
    run_dir = root / planned.workdir
    run_dir.mkdir(parents=True)
    (run_dir / outputs.RUN).write_text("{}")
    (run_dir / "config.json").write_text(json.dumps(planned.config.to_dict()))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(
        {"kind": "train", "stage": s, "step": n, "phase": "train", "loss": 5.0, "lm_loss": 5.0, "kd_loss": 0.0,
         "alpha": 1.0, "tokens_per_s": 1000.0, "grad_norm": 1.0}) + "\n" for s, n in train))
    if made is not None:
        records.write_made(run_dir, planned.config, made={"host": "gpu-node-7", "device_kind": "NVIDIA H100",
                                                          "finished": "2026-11-29T10:00:00+00:00"}, **made)
    if lock:
        now = time.time()
        (run_dir / ".lock").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "token": "t",
                                                   "started": now - 60, "renewed": now}))
    return run_dir


def test_status_reads_every_items_state_from_the_records_and_writes_nothing(micro, tmp_path, capsys, monkeypatch):
    suite, root = _root(micro, tmp_path)
    sweep = suites.sweep_runs(suite)
    main = suites.main_runs(suite, ("optimizer.lr=0.01",))
    passed = {"margin": 0.25, "stages": [], "passed": True}
    _fabricate(root, sweep[0], train=[(1, 4), (2, 4)], made={"wall_s": 100.0, "flops": 1e9, "gate": passed,
                                                             "diverged": None})
    _fabricate(root, sweep[1], train=[(1, 3)], made={"wall_s": None, "flops": None, "gate": passed,
                                                     "diverged": "non-finite loss (nan) in stage 1 at step 3"})
    _fabricate(root, main[0], train=[(1, 4), (2, 2)], lock=True)  # GPT_L seed 1: running
    _fabricate(root, main[1], train=[(1, 2)])  # LOIRE seed 1: stopped halfway through stage 1
    plan = plans.items(suite)
    records.record_failure(root, plan[5].key(), plan[5].label(), 2, "runs/GPT_L/seed2: data_dir is a file")
    before = snapshot(root)

    def written(*args, **kwargs):
        raise AssertionError(f"--status wrote or locked something: {args[:1]}")

    from loire_jax import paths
    from loire_jax.store import locks

    for where, name in ((paths, "write_atomic"), (paths, "create_exclusive"), (locks.WorkdirLock, "acquire")):
        monkeypatch.setattr(where, name, written)
    assert [(s.item.index, s.state) for s in states(suite, root, plan)] == [
        (0, "done"), (1, "failed (gate)"), (2, "done"), (3, "running"), (4, "stopped"), (5, "failed"),
        (6, "not started"), (7, "waiting"), (8, "waiting"), (9, "waiting")]
    from loire_jax.cli.experiment import main as cli

    assert cli(["--suite", str(micro), "--workdir", str(root), "--status"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"suite micro in {root}: 10 items: 2 done, 1 failed (gate), 1 running, 1 stopped, 1 failed, "
                      "1 not started, 3 waiting")
    assert out[1].endswith("done: gpu-node-7, NVIDIA H100, 2026-11-29T10:00:00+00:00")
    assert "failed (gate): diverged: non-finite loss (nan)" in out[2]
    assert f"running: pid {os.getpid()} on {socket.gethostname()}, since " in out[4] and out[4].endswith(
        "; at stage 2 step 2")
    assert out[5].endswith("stopped: at stage 1 step 2, not running: rerun item 4 to resume it")
    assert out[6].endswith("failed: exit 2: runs/GPT_L/seed2: data_dir is a file")
    assert out[8].endswith("waiting: for item 4 (its run)") and out[10].endswith("waiting: for item(s) 3-4, 6-8")  # 5 failed: over
    # 1e9 FLOPs took 100 s: the rest of the runs' planned FLOPs at that rate (stopped and running ones: what is left)
    assert out[11].startswith("time left: about ") and "for 3 runs" in out[11] and "at the 1 finished runs' measured " \
        "1e+05 s per TFLOP (2 min for 1e+09 FLOPs)" in out[11] and "2 fine-tunings not counted" in out[11]
    assert snapshot(root) == before  # read only: not even a reader's lock was left


def test_status_of_a_folder_that_is_no_suite_is_one_line(micro, tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("mine")
    assert one_line(capsys, ["--suite", str(micro), "--workdir", str(tmp_path / "notes"), "--status"]) == (
        f"error: {tmp_path / 'notes'} is no suite's workdir (no .loire_experiment, which launch/experiment.py writes "
        "in every workdir it runs a suite in); pass the --workdir the suite runs in")
    assert "does not exist, so no suite has run there" in one_line(
        capsys, ["--suite", str(micro), "--workdir", str(tmp_path / "nowhere"), "--status"])
    assert not (tmp_path / "nowhere").exists()


# --------------------------------------------------------------------------- --merge refusals
def _source(micro, tmp_path, name="src"):
    suite, root = _root(micro, tmp_path / name)
    return suite, root


@pytest.mark.parametrize("case,says", [
    ("another suite", "(a run of another suite): name: 'other-LOIRE-s1' in it, 'micro-LOIRE-s1' planned"),
    ("another setting", "(a run of another setting): optimizer.lr: 0.03 in it, 0.01 planned"),
    ("another code", "(another config, or a code version whose steps would differ): stages.M1.recovery: 'start' in it, "
                     "'end' planned"),
    ("half-written", "is half-written: its metrics.jsonl ends in the middle of a line"),
    ("damaged", "is damaged or half-written: metrics.jsonl has 1 malformed line(s) (line 1)"),
    ("unreadable record", "is damaged: 1 record(s) of its metrics.jsonl the report cannot read (a train record's loss "
                          "is 'x', not a number)"),
    ("no metrics", "is half-written or damaged ("),
    ("unfinished", "is unfinished (not every stage evaluated)"),
    ("in use", "is in use (a live lock: pid "),
    ("not planned", "no run of this suite's plan is there (another suite, or other seeds or systems)"),
])
def test_a_merge_source_that_is_not_the_planned_run_is_refused_and_nothing_is_copied(micro, tmp_path, capsys, case,
                                                                                      says):
    suite, src = _source(micro, tmp_path)
    planned = suites.main_runs(suite, ("optimizer.lr=0.01",))[1]  # LOIRE at seed 1
    config = planned.config
    if case == "another suite":
        config = config.replace(name="other-LOIRE-s1")
    elif case == "another setting":
        config = config.replace(optimizer=dataclasses.replace(config.optimizer, lr=0.03))
    elif case == "another code":  # as an earlier version recorded it: recovery at each stage's start
        config = config.replace(stages=tuple(dataclasses.replace(s, recovery="start") for s in config.stages))
    where = "runs/LOIRE/seed9" if case == "not planned" else planned.workdir
    run_dir = _fabricate(src, dataclasses.replace(planned, config=config, workdir=where), train=[(1, 4)],
                         lock=case == "in use")
    metrics = run_dir / "metrics.jsonl"
    if case == "half-written":
        metrics.write_text(metrics.read_text() + '{"kind": "train", "sta')
    elif case == "damaged":
        metrics.write_text("not json\n" + metrics.read_text())
    elif case == "no metrics":
        metrics.unlink()
    elif case == "unreadable record":
        metrics.write_text(metrics.read_text().replace('"loss": 5.0', '"loss": "x"'))
    dest = tmp_path / "dest"
    line = one_line(capsys, ["--suite", str(micro), "--workdir", str(dest), "--merge", str(src)])
    assert says in line and line.endswith("nothing was merged"), line
    assert not dest.exists()  # not even made: a refused merge changes nothing


def test_a_merge_source_that_is_no_suites_workdir_is_refused(micro, tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    assert one_line(capsys, ["--suite", str(micro), "--workdir", str(tmp_path / "d"), "--merge",
                             str(tmp_path / "mine")]).startswith(f"error: --merge {tmp_path / 'mine'} is no suite's "
                                                                 "workdir (no .loire_experiment)")
    assert "no such directory" in one_line(capsys, ["--suite", str(micro), "--workdir", str(tmp_path / "d"), "--merge",
                                                    str(tmp_path / "gone")])
    assert not (tmp_path / "d").exists()


def test_the_kubernetes_manifest_runs_each_phase_of_paper_by_its_completion_index():
    """launch/k8s_suite.yaml: an Indexed Job per phase of --suite paper's plan, each pod
    loire-experiment with --phase (its index counted from the phase's first item) reading
    $JOB_COMPLETION_INDEX, as many completions as the phase has items; bad input and bugs
    fail the index, a stop to resume (75) is retried."""
    jobs = list(yaml.safe_load_all((ROOT / "launch" / "k8s_suite.yaml").read_text()))
    ranges = plans.phase_ranges(plans.items(suites.load_suite("paper")))
    assert [j["metadata"]["labels"]["loire-phase"] for j in jobs] == [p for p, _, _ in ranges]
    for job, (phase, first, last) in zip(jobs, ranges):
        spec = job["spec"]
        assert job["kind"] == "Job" and spec["completionMode"] == "Indexed"
        assert spec["completions"] == last - first + 1
        (container,) = spec["template"]["spec"]["containers"]
        command = container["command"]
        assert command[:3] == ["python", "-m", "loire_jax.cli.experiment"]
        assert command[command.index("--suite") + 1] == "paper" and command[command.index("--phase") + 1] == phase
        (env,) = container["env"]
        assert env["name"] == "JOB_COMPLETION_INDEX" == plans.INDEX_VARIABLES[1]
        assert env["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        rules = {r["action"]: r.get("onExitCodes", {}).get("values") for r in spec["podFailurePolicy"]["rules"]
                 if "onExitCodes" in r}
        assert rules == {"FailIndex": [1, 2], "Ignore": [75]}
        assert spec["template"]["spec"]["restartPolicy"] == "Never"
    # the index a pod is given is what the CLI reads, counted from the phase
    suite = suites.load_suite("paper")
    (item,) = plans.resolve(plans.items(suite), *plans.requested(None, {"JOB_COMPLETION_INDEX": "116"}), suite, "main")
    assert (item.index, item.label()) == (123, "main runs/Memory-ELLE-replay/seed5")
