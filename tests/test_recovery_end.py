"""recovery: end end to end: the trainer's reference run with the recovery window at the
stage end (tests/conftest.py's run, which pins start). Growth stays exact, the gate ramps
where growth is, the teachers distil only in the window, each stage compiles one step and one
evaluation, the replay record counts the old data, and a run killed inside the window
resumes bit for bit."""

from __future__ import annotations

import pytest
import yaml
from runs import cli, final_losses, in_process, records, tiny_run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def end_config(tmp_path_factory):
    from data_helpers import tiny_config_dict

    base = tmp_path_factory.mktemp("recovery-end")
    config = tiny_run(tiny_config_dict(base / "data"), "end", "4", eval={"every": 0, "batches": 2}, stages=[
        {"name": "A", "domains": ["SCI"], "steps": 6},
        {"name": "B", "domains": ["NEWS"], "steps": 6,
         "growth": [{"op": "hidden", "size": 32}, {"op": "layers", "size": 2}],
         "warmup_steps": 3, "gate_ramp_steps": 3, "teachers": "all", "replay_ratio": 0.2,
         "beta": 0.1, "beta_steps": 2, "recovery": "end"},
    ])
    path = base / "end.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_recovery_at_the_end_is_exact_one_program_and_resumes_bitwise_inside_the_window(end_config, tmp_path):
    whole = tmp_path / "whole"
    assert in_process(end_config, whole).complete
    train = [r for r in records(whole, "train") if r["stage"] == 2]
    assert [r["phase"] for r in train] == ["train"] * 3 + ["distill"] * 2 + ["warmup"]
    assert all(r["kd_loss"] > 0 for r in train if r["phase"] == "distill")
    assert all(r["kd_loss"] == 0 for r in train if r["phase"] != "distill")
    assert [round(r["alpha"], 4) for r in train][:4] == [0.0, 0.3333, 0.6667, 1.0]  # the ramp stays at growth
    evals = {(r["stage"], r["point"], r["domain"]): r["ppl"] for r in records(whole, "eval")}
    assert evals[2, "init", "SCI"] == pytest.approx(evals[1, "final", "SCI"], rel=1e-4)  # growth is exact
    assert sorted((r["stage"], r["phase"]) for r in records(whole, "compile")) == [
        (1, "eval"), (1, "train"), (2, "eval"), (2, "train")]  # one step and one evaluation a stage
    # 3 window steps x 8 windows x 0.2: 4 old windows of 16 tokens, the other 20 from NEWS's own memory
    assert [(r["stage"], r["tokens"], r["own_memory_tokens"], r["run_tokens"]) for r in records(whole, "replay")] \
        == [(1, 0, 0, 0), (2, 64, 320, 64)]
    killed = cli(end_config, tmp_path / "killed", fault="kill:11")  # stage 2, step 5: in the window, saved at 4
    assert killed.returncode == -9
    assert in_process(end_config, tmp_path / "killed").complete
    assert final_losses(tmp_path / "killed") == final_losses(whole)
