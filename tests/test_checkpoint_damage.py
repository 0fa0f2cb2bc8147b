"""Specification: damage of any kind in a checkpoint step is treated alike. Its arrays
(tests/test_faults.py), its data-iterator state, its meta JSON or one of Orbax's own
metadata files: the step is set aside as ``<step>.damaged-*`` (moved as it is, never
deleted) and the run resumes from the newest intact step to the undisturbed run's losses.

Each case damages step 3 of the second stage of a copy of the shared reference run (see
tests/test_faults.py), after removing step 4 as if the run had been killed before saving
it: step 3 is then the step a resume would start from, and step 2 the intact one before.
A resume costs seconds, so the second flip of the data position is checked up to the
point where the runs part (the verification before any compute).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from runs import snapshot, steps_saved  # noqa: E402  (tests/ is on the path: conftest.py)
from test_faults import config, finished, reference, resumes_to_reference, shared_reference  # noqa: F401,E402

from loire_jax import load_run_config
from loire_jax.train.trainer import Trainer

pytestmark = pytest.mark.slow  # the slow tier: end-to-end runs and CLI subprocesses


def _flip_bit(path: Path, old: bytes, bit: int) -> None:
    """Flip one bit of the byte after ``old`` (a value in a JSON file)."""
    data = bytearray(path.read_bytes())
    at = data.index(old) + len(old)
    data[at] ^= 1 << bit
    path.write_bytes(bytes(data))


def _cut_in_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


DAMAGE = {
    # grain's state file holds {"next_index": 3}; '3' ^ 1 is '2' (a replayed batch), '3' ^ 4 is '7' (past the end)
    "next_index flipped down": lambda step: _flip_bit(step / "data" / "process_0-of-1.json", b'"next_index": ', 0),
    "next_index flipped up": lambda step: _flip_bit(step / "data" / "process_0-of-1.json", b'"next_index": ', 2),
    "meta JSON cut short": lambda step: _cut_in_half(step / "meta" / "metadata"),
    "Orbax metadata cut short": lambda step: _cut_in_half(step / "params" / "_METADATA"),
}


def _damage_step_3(finished: Path, damage: str) -> tuple[Path, dict[str, bytes]]:
    stage = finished / "stage_2"
    shutil.rmtree(stage / "4")
    DAMAGE[damage](stage / "3")
    return stage, snapshot(stage / "3")


def _set_aside(stage: Path, damaged: dict[str, bytes], out: str) -> None:
    assert f"step 3 in {stage} is damaged" in out and "set aside as 3.damaged-" in out, out
    aside = [p for p in stage.iterdir() if p.name.startswith("3.damaged-")]
    assert len(aside) == 1 and snapshot(aside[0]) == damaged  # moved aside as it was, not deleted


@shared_reference
@pytest.mark.parametrize("damage", ["next_index flipped down", "meta JSON cut short", "Orbax metadata cut short"])
def test_a_damaged_step_is_set_aside_and_the_run_resumes_from_the_intact_step_before(config, finished, reference,
                                                                                    damage, capsys):
    stage, damaged = _damage_step_3(finished, damage)
    resumes_to_reference(config, finished, reference)
    out = capsys.readouterr().out
    _set_aside(stage, damaged, out)
    assert f"resuming from stage 2 (B) step 2 of 4 (checkpoint {stage.resolve() / '2'}): stage 1 done, skipped" in out, out


@shared_reference
def test_a_data_position_past_its_step_is_set_aside_before_any_compute(config, finished, capsys):
    stage, damaged = _damage_step_3(finished, "next_index flipped up")
    trainer = Trainer(load_run_config(config), finished, None, [], progress=False)
    try:
        trainer.preflight(False)
    finally:
        trainer.close(release=True)
    _set_aside(stage, damaged, capsys.readouterr().out)
    assert steps_saved(stage) == [2]  # where the resume starts
