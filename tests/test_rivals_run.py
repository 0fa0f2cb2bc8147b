"""End to end: the paper's rivals as runs of the trainer. ELLE (Table 2) on 2 devices, three
stages: its expansion at each stage start, its recovering warmup on the memory alone, then
the domain with replay weighted by forgetting; stopped by SIGTERM inside stage 3's
recovering warmup and resumed by a new process, which weighs the replay from the records
of the earlier stages' evaluations: every loss is reproduced bitwise, as in every other
phase. LiGO (Tables 4, 6) the same way: its operator phase first, then the materialised
model; stopped inside the operator phase and resumed bitwise."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from runs import cli, final_losses, in_process, records, tiny_run

from loire_jax import load_run_config
from loire_jax.experiments.systems import derive

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("rivals")]


@pytest.fixture(scope="module")
def loire_config(tmp_path_factory):
    from data_helpers import tiny_config_dict

    base = tmp_path_factory.mktemp("rivals")
    loire = tiny_run(tiny_config_dict(base / "data"), "rivals", "2", eval={"every": 0, "batches": 2}, stages=[
        {"name": "A", "domains": ["SCI"], "steps": 4},
        {"name": "B", "domains": ["NEWS"], "steps": 4,
         "growth": [{"op": "hidden", "size": 32}, {"op": "layers", "size": 2}],
         "warmup_steps": 2, "gate_ramp_steps": 2, "teachers": "all", "replay_ratio": 0.2,
         "beta": 0.1, "beta_steps": 2},
        {"name": "C", "domains": ["REV"], "steps": 6, "growth": [{"op": "heads", "size": 3}],
         "warmup_steps": 3, "teachers": "all", "replay_ratio": 0.2, "beta": 0.1, "beta_steps": 2},
    ])
    (base / "loire.yaml").write_text(yaml.safe_dump(loire))
    return base / "loire.yaml"


def _system(loire_config, name: str, **stage_changes):
    run = derive(name, load_run_config(loire_config))
    run = run.replace(stages=tuple(dataclasses.replace(s, **stage_changes) if s.growth else s for s in run.stages))
    path = loire_config.parent / f"{name}.yaml"
    path.write_text(yaml.safe_dump(run.to_dict()))
    return path


@pytest.fixture(scope="module")
def elle_config(loire_config):
    return _system(loire_config, "ELLE")


def _uninterrupted(config, tmp_path_factory, name: str):
    workdir = tmp_path_factory.mktemp(name)
    assert in_process(config, workdir).complete
    return workdir


def _stopped_then_resumed(config, reference, workdir, fault: str, said: str) -> str:
    """The CLI stopped by SIGTERM after ``fault``'s step, then resumed in this process: every
    loss equals the uninterrupted run's. Returns what the stopped process printed."""
    stopped = cli(config, workdir, fault=fault)
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    assert said in stopped.stdout, stopped.stdout[-2000:]
    assert in_process(config, workdir).complete
    assert final_losses(workdir) == final_losses(reference)
    return stopped.stdout


@pytest.fixture(scope="module")
def elle_reference(elle_config, tmp_path_factory):
    return _uninterrupted(elle_config, tmp_path_factory, "elle-reference")


def test_elle_expands_recovers_on_the_memory_then_trains_the_domain(elle_reference):
    train = records(elle_reference, "train")
    assert [r["phase"] for r in train if r["stage"] == 2] == ["recover"] * 2 + ["warmup"] * 2
    assert [r["phase"] for r in train if r["stage"] == 3] == ["recover"] * 3 + ["warmup"] * 3
    assert all(r["kd_loss"] == 0.0 for r in train)  # no teachers
    evals = {(r["stage"], r["point"], r["domain"]): r["ppl"] for r in records(elle_reference, "eval")}
    # not function-preserving: the noise and the ungated layer copy move the grown model
    assert evals[2, "init", "SCI"] != pytest.approx(evals[1, "final", "SCI"], rel=1e-4)


def test_elle_stopped_inside_its_recovering_warmup_resumes_every_loss(elle_config, elle_reference, tmp_path):
    # stage 3, step 2: inside the recovering warmup; the resumed stage weighs its replay from the records
    out = _stopped_then_resumed(elle_config, elle_reference, tmp_path, "term:10", "in stage 3 at step 2: checkpoint saved")
    shares = [line for line in out.splitlines() if "replay weighted by forgetting: SCI" in line]
    assert len(shares) == 2, out[-2000:]  # stages 2 and 3


@pytest.fixture(scope="module")
def ligo_config(loire_config):
    return _system(loire_config, "LiGO", ligo_steps=3)  # the paper's 100 of 20k steps would be 1 step here


@pytest.fixture(scope="module")
def ligo_reference(ligo_config, tmp_path_factory):
    return _uninterrupted(ligo_config, tmp_path_factory, "ligo-reference")


def test_ligo_trains_its_operator_then_the_materialised_model(ligo_reference):
    train = records(ligo_reference, "train")
    assert [r["phase"] for r in train if r["stage"] == 3] == ["ligo"] * 3 + ["train"] * 3
    assert [r["phase"] for r in train if r["stage"] == 2] == ["ligo"] * 3 + ["train"]
    evals = {(r["stage"], r["point"], r["domain"]) for r in records(ligo_reference, "eval")}
    assert {(2, "init", "SCI"), (3, "init", "NEWS")} <= evals  # the grown model, after its operator phase
    assert (ligo_reference / "stage_3_ligo").is_dir()


def test_ligo_stopped_inside_its_operator_phase_resumes_every_loss(ligo_config, ligo_reference, tmp_path):
    # stage 3, step 2 of its operator phase
    _stopped_then_resumed(ligo_config, ligo_reference, tmp_path, "term:10", "in stage 3 at step 2: LiGO's operator saved")
