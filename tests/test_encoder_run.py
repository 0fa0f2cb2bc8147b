"""End to end: a LOIRE-Bert run (``loire-train`` on an encoder config) on 2 devices.

Two stages with hidden (duplicated under post-norm) and layer growth, distillation from the
frozen M1 over the masked positions, replay and the gate ramp; then the same run stopped by
SIGTERM mid-stage and resumed, which must reproduce every loss bitwise: the masks are keyed
by (seed, stage, step, row), not by how far a process got.
"""

from __future__ import annotations

import pytest
import yaml
from runs import cli, final_losses, in_process, one_line_error, records, tiny_run

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("encoder")]


@pytest.fixture(scope="module")
def encoder_config(tmp_path_factory):
    from data_helpers import tiny_config_dict

    base = tmp_path_factory.mktemp("encoder")
    config = tiny_run(tiny_config_dict(base / "data"), "bert-e2e", "2", eval={"every": 0, "batches": 2}, stages=[
        {"name": "A", "domains": ["SCI"], "steps": 4},
        {"name": "B", "domains": ["NEWS"], "steps": 4,
         "growth": [{"op": "hidden", "size": 32}, {"op": "layers", "size": 2}],
         "warmup_steps": 2, "gate_ramp_steps": 2, "teachers": "all", "replay_ratio": 0.2,
         "beta": 0.1, "beta_steps": 2, "recovery": "start"},
    ])
    # the trained BPE has <s> and </s>; [MASK] and [PAD] are appended at 320 and 321
    config["model"] = {**config["model"], "preset": "bert", "vocab_size": 322}
    path = base / "bert.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def encoder_reference(encoder_config, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("bert-reference")
    assert in_process(encoder_config, workdir).complete
    return workdir


def test_an_encoder_run_grows_exactly_and_distils_over_masked_positions(encoder_reference):
    train = records(encoder_reference, "train")
    assert [r["phase"] for r in train if r["stage"] == 2] == ["distill"] * 2 + ["train"] * 2
    kd = [r["kd_loss"] for r in train if r["phase"] == "distill"]
    assert abs(kd[0]) < 1e-8 < kd[1]  # the grown student equals its teacher on the first masks, then departs
    evals = {(r["stage"], r["point"], r["domain"]): r for r in records(encoder_reference, "eval")}
    # fixed validation masks: growth keeps the masked-LM perplexity on the same positions
    assert evals[2, "init", "SCI"]["ppl"] == pytest.approx(evals[1, "final", "SCI"]["ppl"], rel=1e-5)
    assert evals[2, "init", "SCI"]["tokens"] == evals[1, "final", "SCI"]["tokens"] > 0
    assert evals[1, "final", "SCI"]["ppl"] < evals[1, "init", "SCI"]["ppl"]


def test_an_encoder_run_stopped_and_resumed_reproduces_every_loss(encoder_config, encoder_reference, tmp_path):
    stopped = cli(encoder_config, tmp_path, fault="term:6")  # stage 2, step 2 (saved at step 2)
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    assert in_process(encoder_config, tmp_path).complete
    assert final_losses(tmp_path) == final_losses(encoder_reference)


@pytest.mark.parametrize("override,says", [
    ("model.vocab_size=320", "no room for an encoder's special tokens"),
    ("seq_len=1", "seq_len=1 leaves an encoder no position to mask"),  # issue 43: it scored PPL 1.00 on nothing
])
def test_an_encoder_that_cannot_run_is_refused_in_one_line_before_its_workdir(encoder_config, tmp_path, override,
                                                                              says):
    result = cli(encoder_config, tmp_path / "w", override)
    one_line_error(result)
    assert says in result.stderr
    assert not (tmp_path / "w").exists()


def test_stage_one_of_an_encoder_run_starts_from_an_encoder_checkpoint(encoder_config, encoder_reference, tmp_path):
    """``init_from`` an encoder's stage: M1 starts where that stage ended (the same fixed
    validation masks give the same perplexity), and trains on."""
    stage = f"{{name: A, domains: [SCI], steps: 2, init_from: {encoder_reference / 'stage_1'}}}"
    assert in_process(encoder_config, tmp_path, f"stages=[{stage}]").complete
    started = {r["domain"]: r["ppl"] for r in records(tmp_path, "eval") if r["point"] == "init"}
    ended = {r["domain"]: r["ppl"] for r in records(encoder_reference, "eval") if r["point"] == "final"
             and r["stage"] == 1}
    assert started["SCI"] == pytest.approx(ended["SCI"], rel=1e-6)


def test_a_decoder_checkpoint_cannot_start_an_encoder_run(encoder_config, tmp_path):
    from runs import ROOT

    result = cli(encoder_config, tmp_path / "w", f"stages.M1.init_from={ROOT / 'tests/fixtures/hf/gpt2'}")
    one_line_error(result)
    assert "kind: checkpoint 'decoder', run 'encoder'" in result.stderr
