"""Specification: a rerun checks its ``--mesh`` whether or not the run is finished.

A finished run trains nothing when it is run again ("run already complete"), but the mesh it
is given is checked as a resume's is, before anything is written: a mesh the batch or a
stage's model cannot be split over, or whose devices cannot hold a stage's parameters,
optimizer state and teachers, could not have run it, and is refused in one line, exit 2.
The fast tests check the preflight (no compute) under a backend that reports its memory;
the slow one reruns a finished run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from data_helpers import tiny_config_dict  # noqa: E402  (tests/data is on the path: conftest.py)
from runs import run_numerics, snapshot, tiny_run  # noqa: E402

from loire_jax.analysis import memory
from loire_jax.config.loader import run_config_from_dict
from loire_jax.errors import RunError, exit_code
from loire_jax.train.trainer import Trainer


def two_stages(data_dir: Path):
    """M1 on SCI, then M2 twice as wide on NEWS with M1 as its teacher."""
    return run_config_from_dict(tiny_run(
        tiny_config_dict(data_dir), "rerun", "1", eval={"every": 0, "batches": 1},
        stages=[{"name": "A", "domains": ["SCI"], "steps": 2},
                {"name": "B", "domains": ["NEWS"], "steps": 2, "growth": [{"op": "hidden", "size": 32}]}]))


def preflight(run_config, workdir: Path, mesh: str) -> None:
    trainer = Trainer(run_config, workdir, mesh, [], progress=False)
    try:
        trainer.preflight(False)
    finally:
        trainer.close(release=True)


def device_holds(monkeypatch, n_bytes: int) -> None:
    """Every device reports a memory limit of ``n_bytes`` (as GPUs do; the CPU reports none)."""
    monkeypatch.setattr(memory, "device_memory", lambda devices: (n_bytes, n_bytes))


def test_a_mesh_whose_devices_cannot_hold_a_stages_state_is_refused_before_the_workdir(tmp_path, monkeypatch):
    """M1's state (its parameters and Adam's two moments) takes about 0.10 MB on one device, M2's
    with its teacher M1 about 0.21 MB, and half as much sharded over two devices: devices of
    0.15 MB refuse the 1-device mesh at M2, naming it, and take the 2-device one; nothing is
    written for the refused one. Devices of 0.03 MB cannot hold even M1 over two."""
    cfg = two_stages(tmp_path / "data")
    device_holds(monkeypatch, 150_000)
    with pytest.raises(RunError) as refused:
        preflight(cfg, tmp_path / "run", "1")
    message = str(refused.value)
    assert message.startswith("mesh {'data': 1, 'fsdp': 1, 'tensor': 1} cannot run stage 2 (B): its parameters, "
                              "optimizer state and teachers alone take "), message
    assert "MiB per device, more than the 0.14 MiB a device holds; give a mesh of more devices" in message
    assert "\n" not in message and exit_code(refused.value) == 2
    assert not (tmp_path / "run").exists()
    preflight(cfg, tmp_path / "run", "2")
    device_holds(monkeypatch, 30_000)
    with pytest.raises(RunError, match=r"mesh \{'data': 1, 'fsdp': 2, 'tensor': 1\} cannot run stage 1 \(A\)"):
        preflight(cfg, tmp_path / "run", "2")


@pytest.mark.slow  # trains a two-stage run of 2 + 2 steps
def test_a_finished_run_rerun_on_a_mesh_that_could_not_have_run_it_is_refused(tmp_path, monkeypatch, capsys):
    """Rerun with a mesh that could have run it, a finished run says it is complete, exit 0;
    with a mesh the model cannot be split over, or whose devices cannot hold its state, it is
    refused in one line, exit 2, as an unfinished resume is, and its workdir does not change."""
    from loire_jax import run

    cfg, workdir = two_stages(tmp_path / "data"), tmp_path / "run"
    with run_numerics():
        assert run(cfg, workdir, mesh="1", progress=False, report=False).complete
        assert run(cfg, workdir, mesh="2", progress=False, report=False).complete  # another mesh that can run it
    assert "run already complete in" in capsys.readouterr().out
    before = snapshot(workdir)
    with run_numerics(), pytest.raises(ValueError, match="does not fit mesh .*tensor': 4"):
        run(cfg, workdir, mesh="tensor=4", progress=False, report=False)  # 2 heads over 4 devices
    device_holds(monkeypatch, 150_000)
    with run_numerics(), pytest.raises(RunError, match=r"mesh \{'data': 1, 'fsdp': 1, 'tensor': 1\} cannot run "
                                                       r"stage 2 \(B\)") as refused:
        run(cfg, workdir, mesh="1", progress=False, report=False)
    assert exit_code(refused.value) == 2
    assert snapshot(workdir) == before
