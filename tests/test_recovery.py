"""Where the recovery window sits (``recovery: start | end``), and how much old data each
system replays: the plan's phases, the refusals, the saved configs of before the option, the
systems derived from LOIRE, and the equal-dose variants. Pure planning, no training (the
end-to-end run is tests/test_recovery_end.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from loire_jax import load_run_config
from loire_jax.config.loader import run_config_from_dict
from loire_jax.config.schedule import phases, recovery_window, replay_record, replay_windows
from loire_jax.errors import ConfigError
from loire_jax.experiments.systems import DOSE_SHARE_CAP, SYSTEMS, derive

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "configs" / "mini.yaml"


def _with(run, **changes):
    return run.replace(stages=tuple(dataclasses.replace(s, **changes) for s in run.stages))


@pytest.fixture(scope="module")
def mini():
    return load_run_config(MINI)


def test_end_puts_replay_and_distillation_in_the_last_warmup_steps(mini):
    """400 steps, warmup 100, beta_steps 20: the window is steps 300-400 at the end, 0-100 at
    the start; the distillation is the window's first 20 steps either way."""
    stage = mini.stages[1]
    assert stage.recovery == "end"  # the default (docs/results.md: the three quotes)
    got = [(p.name, p.start, p.end, p.replay, p.distill) for p in phases(stage, True)]
    assert got == [("train", 0, 300, False, False), ("distill", 300, 320, True, True),
                   ("warmup", 320, 400, True, False)]
    start = [(p.name, p.start, p.end, p.replay, p.distill) for p in phases(dataclasses.replace(stage,
                                                                                              recovery="start"), True)]
    assert start == [("distill", 0, 20, True, True), ("warmup", 20, 100, True, False),
                     ("train", 100, 400, False, False)]
    assert recovery_window(phases(stage, True)) == (300, 400)


def test_the_old_data_count_is_the_same_in_both_places_and_the_own_memory_only_at_the_end(mini):
    end, start = replay_record(mini, 1), replay_record(_with(mini, recovery="start"), 1)
    # 100 steps x 16 windows x 0.1 = 160 windows of 64 tokens
    assert (end["tokens"], start["tokens"]) == (160 * 64, 160 * 64)
    assert (end["own_memory_tokens"], start["own_memory_tokens"]) == ((1600 - 160) * 64, 0)
    assert replay_record(mini, 4)["run_tokens"] == 4 * 160 * 64 and replay_record(mini, 0)["tokens"] == 0


@pytest.mark.parametrize("overrides,needle", [
    (["stages.M2.recovery=middle"], "stages.M2.recovery: Input should be 'start' or 'end'"),
    (["stages.M2.recover_steps=5", "stages.M2.teachers=none"], "runs before the domain's data, at the stage start: "
     "set recovery: start"),
])
def test_a_bad_recovery_is_refused_in_one_line(overrides, needle):
    with pytest.raises(ConfigError, match=needle) as err:
        load_run_config(MINI, overrides)
    assert "\n" not in str(err.value) and "stages.M2" in str(err.value)


def test_a_stage_built_by_hand_refuses_another_place(mini):
    with pytest.raises(ConfigError, match=r"recovery must be one of \('start', 'end'\).*got 'middle'"):
        dataclasses.replace(mini.stages[1], recovery="middle")


def test_a_config_saved_before_the_option_reads_as_start_and_a_new_one_round_trips(mini):
    saved = mini.to_dict()
    assert run_config_from_dict(saved, saved=True) == mini  # recovery: end written and read back
    for stage in saved["stages"]:
        del stage["recovery"]  # what to_dict wrote before the option existed
    assert {s.recovery for s in run_config_from_dict(saved, saved=True).stages} == {"start"}
    # the same mapping as a user's config (not read from a run's workdir) gets today's default
    assert {s.recovery for s in run_config_from_dict(saved).stages} == {"end"}
    # a hand-written stage that leaves it out gets the default
    assert load_run_config(MINI).stages[2].recovery == "end"
    # the first release saved fewer fields still: its stages, too, ran their warmup at the start
    import json

    release = json.loads((ROOT / "tests" / "fixtures" / "release-0.1.0" / "run" / "config.json").read_text())
    assert {s.recovery for s in run_config_from_dict(release, saved=True).stages} == {"start"}


@pytest.mark.parametrize("reading", ["start", "end"])
def test_every_system_derived_from_loire_keeps_its_recovery_in_place(mini, reading):
    """The systems that keep LOIRE's warmup keep its place; those that strip it keep no
    window; the rivals ER and ELLE follow their own recipes, from the stage start, and
    LOIRE-start is LOIRE read the other way, from the stage start whatever the base says."""
    base = _with(mini, recovery=reading)
    for name in SYSTEMS:
        if SYSTEMS[name].kind not in (None, "decoder"):
            continue
        run = derive(name, base)
        for k, stage in enumerate(run.stages[1:], start=1):
            window = recovery_window(phases(stage, k > 0 and stage.teachers != "none"))
            if name in ("ER", "ELLE", "LOIRE-start"):  # their own recipes; LOIRE-start: the other reading
                assert stage.recovery == "start" and window[0] == 0, name
            elif stage.warmup_steps:
                assert stage.recovery == reading, name
                assert window == ((0, stage.warmup_steps) if reading == "start" else
                                  (stage.steps - stage.warmup_steps, stage.steps)), name
            else:
                assert window == (0, 0), name
            assert stage.gate_ramp_steps in (0, base.stages[k].gate_ramp_steps), name  # the ramp is not moved


@pytest.mark.parametrize("reading", ["start", "end"])
@pytest.mark.parametrize("changes", [{}, {"replay_ratio": 0.2}, {"steps": 600, "warmup_steps": 150}])
def test_the_dose_variants_replay_exactly_their_rivals_old_data(mini, reading, changes):
    """LOIRE-ER-replay and LOIRE-ELLE-replay take the dose from ER's and ELLE's derived configs,
    so it stays equal when the base changes; everything else is LOIRE's."""
    base = mini.replace(stages=(mini.stages[0], *(dataclasses.replace(s, recovery=reading, **changes)
                                                  for s in mini.stages[1:])))
    for rival in ("ER", "ELLE"):
        mine, theirs = derive(f"LOIRE-{rival}-replay", base), derive(rival, base)
        assert [replay_windows(mine, k) for k in range(5)] == [replay_windows(theirs, k) for k in range(5)] != [0] * 5
        for ours, stage in zip(mine.stages, base.stages):
            assert ours.replay_ratio <= 0.5 and ours.recovery == stage.recovery
            assert dataclasses.replace(ours, warmup_steps=stage.warmup_steps, replay_ratio=stage.replay_ratio) == stage


def test_a_dose_variant_never_replays_more_than_its_documented_share(mini):
    """The dose variants' old-data share of a batch is at most ``DOSE_SHARE_CAP`` in every
    stage, as --list and docs/results.md say: a stage too short to hold the rival's dose at that
    share is refused, naming the cap and the steps it needs, never given a larger share."""
    short = mini.replace(optimizer=dataclasses.replace(mini.optimizer, warmup_steps=2),
                         stages=(mini.stages[0], *(dataclasses.replace(s, steps=8, warmup_steps=6, gate_ramp_steps=2,
                                                                       beta_steps=2)
                                                    for s in mini.stages[1:])))
    er = derive("LOIRE-ER-replay", short)  # ER's 10% of a stage fits a window of at most half old data
    assert all(s.replay_ratio <= DOSE_SHARE_CAP for s in er.stages) and any(s.replay_ratio for s in er.stages)
    with pytest.raises(ValueError, match=r"at most 50% old data in each batch, but stage 'M2-NEWS' has 8 steps"):
        derive("LOIRE-ELLE-replay", short)  # its 6 memory-only steps alone are more than half of 8
    assert f"at most {DOSE_SHARE_CAP:.0%} of each batch" in SYSTEMS["LOIRE-ELLE-replay"].what


@pytest.mark.parametrize("reading", ["start", "end"])
def test_a_stages_data_stream_is_decided_once_from_its_config(mini, reading):
    """``config.stream.stage_stream``: the window the schedule plans, the memory of the domains
    the stage replays, and its own memory beside them only where the window closes the stage."""
    from loire_jax.config.stream import stage_stream

    run = mini.replace(stages=(mini.stages[0], *(dataclasses.replace(s, recovery=reading) for s in mini.stages[1:])))
    names = [d.name for d in run.data.domains]
    for k, stage in enumerate(run.stages):
        stream = stage_stream(run, k)
        assert (stream.replay_start, stream.replay_end) == recovery_window(phases(stage, k > 0))
        assert [names[j] for j in stream.memory_domains] == list(run.stages[j].domains[0] for j in range(k))
        assert stream.own_memory == (stage.recovery == "end") and stream.steps == stage.steps
        assert (names[stream.domain], stream.seed) == (stage.domains[0], run.data_seed(k))
    elle = derive("ELLE", run)
    assert stage_stream(elle, 2).prompts and stage_stream(elle, 2).recover_steps == elle.stages[2].recover_steps
