"""Where the recovery window sits (``recovery: start | end``), and how much old data each
system replays: the plan's phases, the refusals, the saved configs of before the option, the
systems derived from LOIRE, and the systems matched to a rival's replay. Pure planning, no training (the
end-to-end run is tests/test_recovery_end.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from loire_jax import load_run_config
from loire_jax.config.loader import run_config_from_dict
from loire_jax.config.schedule import phases, recovery_window, replay_record, replay_windows
from loire_jax.errors import ConfigError
from loire_jax.experiments.systems import SYSTEMS, derive

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
    (["stages.M2.recover_steps=5"], "runs before the domain's data, at the stage start: set recovery: start"),
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
    window; the rivals ER and ELLE follow their own recipes, from the stage start, as do the
    systems matched to their replay; a ``-start`` row is its system read the other way,
    from the stage start whatever the base says."""
    base = _with(mini, recovery=reading)
    for name in SYSTEMS:
        if SYSTEMS[name].kind not in (None, "decoder"):
            continue
        run = derive(name, base)
        for k, stage in enumerate(run.stages[1:], start=1):
            window = recovery_window(phases(stage, k > 0 and stage.teachers != "none"))
            if name in ("ER", "ELLE", *MATCHED) or SYSTEMS[name].reading == "start":
                assert stage.recovery == "start" and window[0] == 0, name
            elif stage.warmup_steps:
                assert stage.recovery == reading, name
                assert window == ((0, stage.warmup_steps) if reading == "start" else
                                  (stage.steps - stage.warmup_steps, stage.steps)), name
            else:
                assert window == (0, 0), name
            assert stage.gate_ramp_steps in (0, base.stages[k].gate_ramp_steps), name  # the ramp is not moved


# The systems matched to a rival's replay, and the rival each one replays as.
MATCHED = {"LOIRE-ER-replay": "ER", "Memory-ER-replay": "ER", "LOIRE-ELLE-replay": "ELLE",
           "Memory-ELLE-replay": "ELLE"}


class _Prepared:
    """A stand-in for a prepared corpus: every token names its domain, its split and its
    place, so each window a stream draws says where it came from (``_origin``)."""

    token_meta = {}

    def tokens(self, j: int, split: str):
        import numpy as np

        return (j * 2 + (split == "memory")) * 100_000 + np.arange(65 * 40, dtype=np.int64)


def _origin(window, names):
    """(domain, split, window index) of a drawn window, from its last token (never a prompt)."""
    code, place = divmod(int(window[-1]), 100_000)
    return names[code // 2], "memory" if code % 2 else "pretrain", (place - 64) // 64


def _batches(run, k, weights=None):
    """Every batch stage ``k`` (0-based) of ``run`` trains on, drawn by the data pipeline."""
    import numpy as np

    from loire_jax.config.stream import stage_stream
    from loire_jax.data.pipeline import train_dataset

    ds = train_dataset(run.data, stage_stream(run, k, weights))
    return np.stack([ds[i]["tokens"] for i in range(len(ds))])


def _short(run):
    """``run`` with batches of 10 windows and short later stages (12 steps, a window of 6, 2
    distilling), for cheap draws (grain draws a window in about a millisecond)."""
    return run.replace(batch_size=10, optimizer=dataclasses.replace(run.optimizer, warmup_steps=2), stages=(
        run.stages[0], *(dataclasses.replace(s, steps=12, warmup_steps=6, gate_ramp_steps=6, beta_steps=2)
                         for s in run.stages[1:])))


def test_the_replay_matched_systems_draw_their_rivals_windows_at_every_step_and_position(mini, monkeypatch):
    """LOIRE-ER-replay and Memory-ER-replay train on ER's batches, LOIRE-ELLE-replay and
    Memory-ELLE-replay on ELLE's (its domain prompt, position 0, aside): the same window, of
    the same domain and split, at every step and position of the last stage, where four
    domains' memories are there to replay (each stage's stream is planned by the same
    code; the plans of all of them are compared when the systems are derived). ER itself: the
    previous domain's memory only, one window in ten of every batch of the stage; ELLE's:
    the memory alone for its recovering steps. ELLE's forgetting weights come from each
    run's own evaluations; the same weights are given to both here, so the rule is what is
    compared."""
    import numpy as np

    from loire_jax.data import pipeline

    monkeypatch.setattr(pipeline, "load_prepared", lambda cfg: _Prepared())
    base = _short(mini)
    names = [d.name for d in base.data.domains]
    rivals, k = {r: derive(r, base) for r in ("ER", "ELLE")}, 4
    weights = (1.0, 2.0, 3.0, 4.0)  # any, the same on both sides
    theirs = {"ER": _batches(rivals["ER"], k), "ELLE": _batches(rivals["ELLE"], k, weights)}
    for name, rival in MATCHED.items():
        mine = _batches(derive(name, base), k, weights if rival == "ELLE" else None)
        cut = 1 if rival == "ELLE" else 0  # ELLE's prompt token, its model's input, not its replay
        assert mine.shape == theirs[rival].shape and np.array_equal(mine[..., cut:], theirs[rival][..., cut:]), name
    er = [[_origin(w, names) for w in batch] for batch in theirs["ER"]]
    memory = [[(d, s) for d, s, _ in batch if s == "memory"] for batch in er]
    assert {o for batch in memory for o in batch} == {(names[k - 1], "memory")}  # D_{t-1} only
    assert [len(batch) for batch in memory] == [1] * 12  # one window in ten, every batch of the stage
    elle = [[_origin(w, names) for w in batch] for batch in theirs["ELLE"]]
    recover = rivals["ELLE"].stages[k].recover_steps
    assert recover == 6 and all({s for _, s, _ in batch} == {"memory"} for batch in elle[:recover])
    assert {d for batch in elle for d, s, _ in batch if s == "memory"} == set(names[:k])  # every earlier domain
    assert not np.array_equal(_batches(derive("LOIRE", base), k), theirs["ER"])


def test_the_replay_matched_systems_distil_in_their_windows_first_steps_and_their_memory_controls_never(mini):
    """LOIRE's teachers distil the first beta_steps of the rival's replay (ER's mixed batches
    from the stage start; ELLE's memory-only steps), the rest is the rival's schedule; the
    Memory controls run the same steps without teachers; growth and gate ramp are LOIRE's."""
    loire = derive("LOIRE", mini)
    for name, rival in MATCHED.items():
        run, theirs = derive(name, mini), derive(rival, mini)
        for k in range(1, 5):
            got = [(p.name, p.start, p.end, p.replay, p.distill) for p in phases(run.stages[k], True)]
            steps, kd, recover = run.stages[k].steps, run.stages[k].beta_steps, theirs.stages[k].recover_steps
            if name.startswith("Memory"):
                assert not any(p[4] for p in got) and run.stages[k].teachers == "none", name
            elif rival == "ER":
                assert got == [("distill", 0, kd, True, True), ("warmup", kd, steps, True, False)], name
            else:
                assert got == [("distill", 0, kd, True, True), ("recover", kd, recover, True, False),
                               ("warmup", recover, steps, True, False)], name
            assert (run.stages[k].growth, run.stages[k].gate_ramp_steps) == \
                (loire.stages[k].growth, loire.stages[k].gate_ramp_steps), name
            assert replay_windows(run, k) == replay_windows(theirs, k) > 0, name


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
