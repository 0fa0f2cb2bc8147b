"""Specification: a run never deletes, nor writes into, what it did not create.

Every workdir is resolved (``..``, links) before it is checked; a directory that holds the
user's other work (the current directory or one above it, the home directory, the
checkout) is refused before anything is created; ``--fresh`` deletes only the names a run
writes. The two data-loss cases users met are replayed here with the trainer's own
preflight (the workdir half of a run, no compute): ``--workdir DIR/new/..`` and a run
named ``..``. A run that failed before it trained anything leaves no history that
refuses the corrected config, and a read-only disk is called that. Nothing is moved or
deleted from under a live process: ``--fresh`` is refused, naming it, while a fine-tuning
job, an export or a report holds a lock below the run; a lock whose holder is gone does not
count.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from data_helpers import tiny_config_dict  # noqa: E402  (tests/data is on the path: conftest.py)
from runs import ROOT, snapshot, tiny_run  # noqa: E402

from loire_jax import paths
from loire_jax.config.loader import load_run_config, run_config_from_dict
from loire_jax.config.run import RunConfig
from loire_jax.errors import RunError, exit_code
from loire_jax.store import workdir as rundir
from loire_jax.store.workdir import MARKER, WorkdirError
from loire_jax.train.trainer import Trainer


def run_dict(data_dir: Path, **changes) -> dict:
    return {**tiny_run(tiny_config_dict(data_dir), "safety", "1", eval={"every": 0, "batches": 1},
                       stages=[{"name": "A", "domains": ["SCI"], "steps": 2}]), **changes}


@pytest.fixture
def run_config(tmp_path) -> RunConfig:
    return run_config_from_dict(run_dict(tmp_path / "data"))


def preflight(run_config: RunConfig, workdir, *, fresh: bool = False) -> Trainer:
    """What a run does to its workdir before any compute: check, lock, --fresh, marker, config."""
    trainer = Trainer(run_config, workdir, None, [], progress=False)
    try:
        trainer.preflight(fresh)
    finally:
        trainer.close(release=True)
    return trainer


def user_files(folder: Path, names: list[str]) -> dict[str, bytes]:
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(f"the user's own {name}")
    return snapshot(folder)


# --------------------------------------------------------------------------- resolved first
def test_a_workdir_through_a_missing_folder_and_dotdot_is_checked_as_the_folder_it_names(run_config, tmp_path):
    """``--workdir DIR/new/..`` is DIR: DIR holds the user's files and no marker, so it is
    refused, and no marker is planted that a later ``--workdir DIR --fresh`` would obey."""
    folder = tmp_path / "some" / "dir"
    before = user_files(folder, ["thesis.tex", "data/table.csv"])
    with pytest.raises(WorkdirError, match="not a loire_jax run directory") as refused:
        preflight(run_config, f"{folder}/nonexist/..")
    assert str(folder) in str(refused.value) and "nonexist" not in str(refused.value)
    with pytest.raises(WorkdirError, match="not a loire_jax run directory"):
        preflight(run_config, folder, fresh=True)
    assert snapshot(folder) == before and not (folder / MARKER).exists() and not (folder / "nonexist").exists()


def test_the_run_uses_the_resolved_workdir_throughout(run_config, tmp_path):
    """A link or a ``..`` names a directory; the run's lock, marker and files are there."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    trainer = preflight(run_config, f"{tmp_path}/link/new/../run")
    assert trainer.workdir == paths.as_path(tmp_path / "real" / "run")
    assert sorted(p.name for p in (tmp_path / "real" / "run").iterdir()) == [MARKER, "config.json", "stage_1"]
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["run"]


def test_a_gs_workdir_is_normalised_and_refused_if_it_climbs_out_of_its_bucket(monkeypatch):
    monkeypatch.setattr(paths, "_check_backend", lambda kind: None)  # gcsfs stands installed; no bucket is touched
    assert str(rundir.resolve("gs://bucket/runs/new/../a/./b/")) == "gs://bucket/runs/a/b"
    with pytest.raises(WorkdirError, match="climbs out of its bucket"):
        rundir.resolve("gs://bucket/runs/../../other")


# --------------------------------------------------------------------------- places that hold other work
def test_a_run_named_dotdot_is_refused_and_never_writes_into_or_empties_the_project(run_config, tmp_path,
                                                                                     monkeypatch):
    """``name=..`` made the default workdir ``runs/..``, the checkout: the run wrote into
    it and a later ``--fresh`` deleted README.md, configs/, loire_jax/ and tests/."""
    project = tmp_path / "project"
    before = user_files(project, ["README.md", "configs/tiny.yaml", "loire_jax/__init__.py", "tests/test_x.py"])
    monkeypatch.chdir(project)
    for name in ("..", "."):
        with pytest.raises(ValueError, match=r"name must be .*not '\.' or '\.\.'"):
            load_run_config(ROOT / "configs" / "tiny.yaml", [f"name={name}"])
    for fresh in (False, True):  # the workdir such a name made: refused, --fresh or not
        with pytest.raises(WorkdirError, match=f"workdir {project} is the current directory"):
            preflight(run_config, rundir.default_workdir(".."), fresh=fresh)
    with pytest.raises(WorkdirError, match=f"workdir {tmp_path} holds the current directory"):
        preflight(run_config, "..", fresh=True)
    assert snapshot(project) == before and not (project / MARKER).exists()


def test_the_checkout_and_the_home_directory_are_refused_as_workdirs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(WorkdirError, match="is the loire_jax checkout"):
        rundir.check_usable(ROOT)
    home = tmp_path / "home"
    user_files(home, [".bashrc"])
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(WorkdirError, match="is your home directory"):
        rundir.fresh("~")
    assert (home / ".bashrc").exists() and not (ROOT / MARKER).exists()


# --------------------------------------------------------------------------- --fresh deletes what runs wrote
def test_fresh_deletes_only_what_runs_write_and_names_what_it_left(run_config, tmp_path, capsys):
    """A marked workdir (an earlier version's marker has no list of what it wrote) with the
    user's files beside the run's: --fresh deletes the run's entries, keeps every other one."""
    workdir = tmp_path / "run"
    preflight(run_config, workdir)
    run_entries = ["stage_1/2/params", "stage_2/1/x", "metrics.jsonl", "tb/events.out", "report/report.md",
                   "python.log", "python.1.log", "crash-20250101-120000-0.log", ".config.json.k2j4.tmp"]
    user_files(workdir, run_entries)
    mine = user_files(workdir, ["notes.md", "analysis/plot.ipynb", "stage_x/keep.txt", "config.json.bak"])
    mine = {k: v for k, v in mine.items() if not rundir.is_run_entry(k.split("/")[0])}
    preflight(run_config, workdir, fresh=True)
    assert {k: v for k, v in snapshot(workdir).items() if k in mine} == mine
    left = sorted(p.name for p in workdir.iterdir())
    assert left == [MARKER, "analysis", "config.json", "config.json.bak", "notes.md", "stage_1", "stage_x"], left
    assert not list((workdir / "stage_1").iterdir())  # an empty manager folder of the new session
    said = [line for line in capsys.readouterr().out.splitlines() if "--fresh" in line]
    assert len(said) == 1 and "left 4 other entries in place: analysis, config.json.bak, notes.md, stage_x" in said[0]


def test_fresh_moves_the_old_models_fine_tuning_results_aside_and_says_so(run_config, tmp_path, capsys):
    """finetune/ holds scores of the model --fresh retrains: never deleted, never left in
    place to pass for the new model's; moved aside (a second --fresh takes the next name)."""
    workdir = tmp_path / "run"
    preflight(run_config, workdir)
    old = user_files(workdir, ["finetune/sent/stage1/seed1/results.json", "finetune/sent/stage1/summary.json"])
    (workdir / "finetune.stale-1").mkdir()  # an earlier --fresh's: kept, and not reused as a name
    preflight(run_config, workdir, fresh=True)
    assert not (workdir / "finetune").exists()
    assert snapshot(workdir / "finetune.stale-2") == {k[len("finetune/"):]: v for k, v in old.items()
                                                      if k.startswith("finetune/")}
    said = [line for line in capsys.readouterr().out.splitlines() if "--fresh" in line]
    assert len(said) == 1 and "moved finetune/ aside to finetune.stale-2/ (results of the old model)" in said[0]
    assert "left 1 other entry in place: finetune.stale-1" in said[0], said


# --------------------------------------------------------------------------- history and the environment
def test_a_run_that_failed_before_its_first_step_does_not_block_a_corrected_config(tmp_path, monkeypatch):
    """Bad data stops the run before it trains anything: the corrected data is no 'different run'."""
    from loire_jax import run
    from loire_jax.data import DataError
    from loire_jax.train import trainer

    monkeypatch.setattr(trainer, "peak_flops", lambda devices: trainer.Peak(None, "not measured"))  # no matmul

    bad = run_dict(tmp_path / "data")
    good_paths = bad["data"]["domains"][0]["source"]["paths"]
    (tmp_path / "empty.txt").write_text("")  # found by the preflight, empty only once read (a missing file is refused before the workdir)
    bad["data"]["domains"][0]["source"]["paths"] = [str(tmp_path / "empty.txt")]
    workdir = tmp_path / "run"
    with pytest.raises(DataError, match="is empty"):
        run(run_config_from_dict(bad), workdir, progress=False)
    assert (workdir / "config.json").exists()  # the failed run's config: it binds nothing
    bad["data"]["domains"][0]["source"]["paths"] = good_paths
    preflight(run_config_from_dict(bad), workdir)


def test_a_read_only_file_system_is_named_as_such_with_what_to_do(run_config, tmp_path, monkeypatch):
    class ReadOnly:
        f_flag = os.ST_RDONLY

    monkeypatch.setattr(os, "access", lambda path, mode: False)  # what access(2) answers there (EROFS)
    monkeypatch.setattr(os, "statvfs", lambda path: ReadOnly())
    with pytest.raises(WorkdirError, match="read-only file system; remount it read-write or pass a --workdir"):
        rundir.check_usable(tmp_path / "run")
    monkeypatch.undo()

    def read_only(workdir):  # a mount that turned read-only after the check
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(workdir / MARKER))

    monkeypatch.setattr(rundir, "create", read_only)
    with pytest.raises(RunError, match="read-only file system; remount it read-write") as refused:
        preflight(run_config, tmp_path / "run")
    assert "permission" not in str(refused.value)


# --------------------------------------------------------------------------- live locks below the run
def _job(workdir: Path, job: str = "boolq", stage: int = 1) -> Path:
    """A fine-tuning job's folder with a seed's results, as loire-finetune leaves it."""
    user_files(workdir, [f"finetune/{job}/stage{stage}/seed0/results.json"])
    return workdir / "finetune" / job / f"stage{stage}"


def _dead_pid() -> int:
    """A pid no process has on this host now."""
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) - 1
    while pid > 1:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1
    raise AssertionError("no free pid")


def _lock_file(path: Path, *, pid: int, host: str, age_s: float, doing: str | None = None) -> None:
    now = time.time()
    path.write_text(json.dumps({"pid": pid, "host": host, "job": None, "token": "theirs", "doing": doing,
                                "started": now - age_s, "renewed": now - age_s}))


def test_fresh_is_refused_while_a_fine_tuning_job_of_the_run_is_live(run_config, tmp_path):
    """``--fresh`` moved ``finetune/`` aside with a live job's lock inside it, and the job then
    wrote the old model's results into the new ``finetune/``. While the job holds its lock,
    ``--fresh`` is refused in one line naming the job's process, and nothing is moved or
    deleted; once the job is over it goes ahead."""
    from loire_jax.downstream import provenance

    workdir = tmp_path / "run"
    preflight(run_config, workdir)
    root = _job(workdir)
    with provenance.job_lock(root, True, print):
        before = snapshot(workdir)
        with pytest.raises(WorkdirError) as refused:
            preflight(run_config, workdir, fresh=True)
        assert snapshot(workdir) == before
    message = str(refused.value)
    assert message.startswith(f"--fresh refused: {root} is in use by pid {os.getpid()} on host "
                              f"{socket.gethostname()} (fine-tuning boolq on stage1; lock renewed 0 s ago)"), message
    assert "nothing was moved or deleted" in message and str(root / rundir.LOCK) in message and "\n" not in message
    assert exit_code(refused.value) == 2
    preflight(run_config, workdir, fresh=True)
    assert (workdir / "finetune.stale-1" / "boolq" / "stage1" / "seed0" / "results.json").is_file()
    assert not (workdir / "finetune").exists()


@pytest.mark.parametrize("case", ["another host, renewed 5 s ago", "a half-written lock"])
def test_a_lock_that_may_be_live_blocks_fresh(tmp_path, case):
    """A lock of another host cannot be checked by its pid: it counts until its lease runs
    out. A lock file being written (not yet JSON) counts as held too, by its file's age."""
    rundir.create(tmp_path / "run")
    root = _job(tmp_path / "run")
    if case.startswith("another host"):
        _lock_file(root / rundir.LOCK, pid=4242, host="gpu-node-3", age_s=5, doing="fine-tuning boolq on stage 1")
        said = "in use by pid 4242 on host gpu-node-3 (fine-tuning boolq on stage 1; lock renewed 5 s ago)"
    else:
        (root / rundir.LOCK).write_text("")
        said = "in use by pid None on host None (lock renewed 0 s ago)"
    before = snapshot(tmp_path / "run")
    with pytest.raises(WorkdirError, match=f"--fresh refused: .*{said}".replace("(", r"\(").replace(")", r"\)")):
        rundir.fresh(tmp_path / "run")
    assert snapshot(tmp_path / "run") == before


@pytest.mark.parametrize("case", ["a dead pid on this host", "another host's lease ran out"])
def test_a_lock_whose_holder_is_gone_does_not_block_fresh(tmp_path, case):
    rundir.create(tmp_path / "run")
    root = _job(tmp_path / "run")
    if case.startswith("a dead pid"):
        _lock_file(root / rundir.LOCK, pid=_dead_pid(), host=socket.gethostname(), age_s=1)
    else:
        _lock_file(root / rundir.LOCK, pid=4242, host="tpu-worker-7", age_s=rundir.LEASE_S + 60)
    assert rundir.fresh(tmp_path / "run").moved == [("finetune", "finetune.stale-1")]


def test_a_fine_tuning_jobs_folder_is_not_set_aside_with_a_live_lock_inside(tmp_path):
    """A stale job's folder is moved aside by the next call; never while a process holds a lock in it."""
    folder = tmp_path / "finetune" / "boolq" / "stage1" / "seed0"
    folder.mkdir(parents=True)
    lock = rundir.WorkdirLock(folder)
    lock.acquire()
    try:
        with pytest.raises(WorkdirError, match=f"moving {folder} aside refused: {folder} is in use by pid {os.getpid()}"):
            rundir.set_aside(folder)
        assert folder.is_dir() and not list(folder.parent.glob("seed0.stale-*"))
    finally:
        lock.release()
    assert rundir.set_aside(folder).name == "seed0.stale-1"


def test_fresh_is_refused_while_a_report_reads_the_run(run_config, tmp_path, monkeypatch, capsys):
    """``loire-report`` holds a reader's lock on each run it reads: a ``--fresh`` meanwhile is
    refused naming it; the lock is gone when the report is written."""
    from loire_jax.analysis import reports
    from loire_jax.cli import report

    workdir = tmp_path / "run"
    preflight(run_config, workdir)
    seen = []

    def write_report(workdirs, out=None, **kw):
        try:
            rundir.fresh(workdir)
        except WorkdirError as err:
            seen.append(str(err))
        (tmp_path / "out").mkdir()
        return tmp_path / "out"

    monkeypatch.setattr(reports, "write_report", write_report)
    assert report.main([str(workdir)]) == 0
    assert len(seen) == 1 and seen[0].startswith(f"--fresh refused: {workdir} is in use by pid {os.getpid()}"), seen
    assert "(writing a report; lock renewed 0 s ago)" in seen[0] and (workdir / "config.json").is_file()
    assert not [p for p in workdir.iterdir() if p.name.startswith(".lock")]


def test_fresh_is_refused_while_an_export_reads_the_run(run_config, tmp_path, monkeypatch, capsys):
    """``loire-export-hf`` holds a reader's lock while it reads the stage's checkpoint."""
    from loire_jax.cli import export_hf
    from loire_jax.interop.hf import HFError
    from loire_jax.store import provenance

    workdir = tmp_path / "run"
    preflight(run_config, workdir)
    (workdir / "stage_1" / "2").mkdir(parents=True)
    (workdir / "stage_1" / "2" / "commit_success.txt").write_text("")  # a complete step, as listed
    seen = []

    def check_stage(run, stage, where):
        try:
            rundir.fresh(workdir)
        except WorkdirError as err:
            seen.append(str(err))
        raise HFError("stopped here by the test, before any array is read")

    monkeypatch.setattr(provenance, "check_stage", check_stage)
    assert export_hf.main([str(workdir), str(tmp_path / "hf")]) == 2
    assert len(seen) == 1 and f"in use by pid {os.getpid()}" in seen[0], seen
    assert f"(exporting to {tmp_path / 'hf'}; lock renewed" in seen[0]
    assert (workdir / "stage_1" / "2" / "commit_success.txt").is_file()
    assert not [p for p in workdir.iterdir() if p.name.startswith(".lock")]


_HOLD = """import sys
from loire_jax.store.workdir import WorkdirLock
lock = WorkdirLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
sys.stdin.read()
"""


@pytest.mark.slow  # starts a process (about a second)
def test_another_live_process_lock_blocks_fresh_until_that_process_is_gone(run_config, tmp_path):
    """Held by another process of this host, the job's lock blocks ``--fresh`` by that
    process's pid; once the process is killed (kill -9: its lock stays on disk) the lock is
    stale and ``--fresh`` goes ahead."""
    workdir = tmp_path / "run"
    preflight(run_config, workdir)
    root = _job(workdir)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(root)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(WorkdirError, match=f"--fresh refused: {root} is in use by pid {holder.pid} "):
            preflight(run_config, workdir, fresh=True)
        assert (root / "seed0" / "results.json").is_file()
    finally:
        holder.kill()
        holder.wait()
    assert (root / rundir.LOCK).is_file()
    preflight(run_config, workdir, fresh=True)
    assert (workdir / "finetune.stale-1" / "boolq" / "stage1" / "seed0" / "results.json").is_file()
