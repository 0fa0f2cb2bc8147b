"""Specification: a run never deletes, nor writes into, what it did not create.

Every workdir is resolved (``..``, links) before it is checked; a directory that holds the
user's other work (the current directory or one above it, the home directory, the
checkout) is refused before anything is created; ``--fresh`` deletes only the names a run
writes. The two data-loss cases users met are replayed here with the trainer's own
preflight (the workdir half of a run, no compute): ``--workdir DIR/new/..`` and a run
named ``..``. A run that failed before it trained anything leaves no history that
refuses the corrected config, and a read-only disk is called that.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from data_helpers import tiny_config_dict  # noqa: E402  (tests/data is on the path: conftest.py)
from runs import ROOT, snapshot, tiny_run  # noqa: E402

from loire_jax import paths
from loire_jax.config.loader import load_run_config, run_config_from_dict
from loire_jax.config.run import RunConfig
from loire_jax.errors import RunError
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
