"""Every baseline and ablation is LOIRE's config with one documented change: the same data,
seed, batches, steps and evaluation, and otherwise exactly the difference the paper names."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from loire_jax import load_run_config
from loire_jax.config.schedule import replay_domains, stage_models
from loire_jax.experiments.systems import SYSTEMS, derive

ROOT = Path(__file__).resolve().parents[1]
SHARED = ("data", "seed", "batch_size", "seq_len", "eval", "optimizer", "precision", "mesh", "microbatches",
          "checkpoint")


@pytest.fixture(scope="module")
def loire():
    return load_run_config(ROOT / "configs" / "mini.yaml")


def _shape(m):
    return (m.hidden, m.ffn, m.heads, m.layers)


def _later(run):
    return run.stages[1:]


@pytest.mark.parametrize("name", list(SYSTEMS))
def test_every_system_shares_the_data_seed_budget_and_evaluation(loire, name):
    run = derive(name, loire)
    for field in SHARED:
        assert getattr(run, field) == getattr(loire, field), (name, field)
    assert [(s.name, s.domains, s.steps) for s in run.stages] == [(s.name, s.domains, s.steps) for s in loire.stages]
    assert run.stages[0] == loire.stages[0]  # M1 on the first domain, from scratch, for everyone
    assert run.name == f"{loire.name}-{name}"


def test_sizes_of_the_systems(loire):
    models = stage_models(loire)
    m1, m5 = _shape(models[0]), _shape(models[-1])
    for name in ("GPT_S", "ER", "Token-KD"):
        assert {_shape(m) for m in stage_models(derive(name, loire))} == {m1}, name
    for name in ("GPT_L", "GPT_R"):
        assert {_shape(m) for m in stage_models(derive(name, loire))} == {m5}, name
    for name in ("LOIRE", "Layer-stack", "Random", "Zero", "Single-KD", "Memory", "SCHL-Reverse"):
        got = stage_models(derive(name, loire))
        assert (_shape(got[0]), _shape(got[-1])) == (m1, m5), name
    reverse = [_shape(m) for m in stage_models(derive("SCHL-Reverse", loire))]
    # layers first, hidden last: the grown dimension at each stage is LOIRE's in reverse
    grown = [next(i for i in range(4) if a[i] != b[i]) for a, b in zip(reverse, reverse[1:])]
    assert grown == [3, 2, 1, 0]


def _warmup(stage):
    return (stage.warmup_steps, stage.replay_ratio, stage.replay_from, stage.teachers, stage.beta, stage.beta_steps)


def test_what_each_system_changes_in_the_later_stages(loire):
    base = _later(loire)
    assert all(s.growth and s.teachers == "all" and s.replay_ratio > 0 and s.beta > 0 for s in base)
    plain = (0, 0.0, "all", "none", 0.0, 0)
    for name in ("GPT_S", "GPT_L"):
        assert {(_warmup(s), s.growth) for s in _later(derive(name, loire))} == {(plain, ())}, name
    assert [_warmup(s) for s in _later(derive("GPT_R", loire))] == \
        [(s.warmup_steps, s.replay_ratio, "all", "none", 0.0, 0) for s in base]
    assert [_warmup(s) for s in _later(derive("ER", loire))] == \
        [(s.steps, s.replay_ratio, "previous", "none", 0.0, 0) for s in base]
    assert [(_warmup(s), s.growth) for s in _later(derive("Token-KD", loire))] == \
        [((s.warmup_steps, s.replay_ratio, "all", "last", s.beta, s.beta_steps), ()) for s in base]
    assert [_warmup(s) for s in _later(derive("Single-KD", loire))] == \
        [(*_warmup(s)[:3], "last", *_warmup(s)[4:]) for s in base]
    assert [_warmup(s) for s in _later(derive("Memory", loire))] == \
        [(*_warmup(s)[:3], "none", 0.0, 0) for s in base]
    for name in ("Layer-stack", "Random", "Zero", "SCHL-Reverse"):
        assert [_warmup(s) for s in _later(derive(name, loire))] == [_warmup(s) for s in base], name


def test_growth_of_the_ablations(loire):
    def growth(name):
        return [(g.op, g.size, g.init, g.mode, g.exact) for s in derive(name, loire).stages for g in s.growth]

    ours = growth("LOIRE")
    assert all(init == "loire" and mode == "plugin" and exact for _, _, init, mode, exact in ours)
    assert growth("Layer-stack") == [(o, n, i, "stack" if o == "layers" else m, e) for o, n, i, m, e in ours]
    for kind in ("random", "zero"):
        assert growth(kind.capitalize()) == [(o, n, i, m, e) if o == "layers" else (o, n, kind, m, False)
                                             for o, n, i, m, e in ours]
    assert growth("SCHL-Reverse") == ours[::-1]


def test_er_replays_only_the_previous_domain(loire):
    er = derive("ER", loire)
    assert [replay_domains(er, k) for k in range(1, 5)] == [("WB",), ("NEWS",), ("REV",), ("BIO",)]
    assert replay_domains(loire, 3) == ("WB", "NEWS", "REV")


def test_refusals(loire):
    with pytest.raises(ValueError, match="unknown system 'ELLE'"):
        derive("ELLE", loire)
    with pytest.raises(ValueError, match="replay_from must be one of"):
        dataclasses.replace(loire.stages[1], replay_from="some")


@pytest.mark.parametrize("name", ["paper-mini", "paper"])
def test_the_shipped_suites_plan_every_run(name):
    from loire_jax.experiments.suite import load_suite, main_runs, sweep_runs

    suite = load_suite(name)
    sweep = sweep_runs(suite)
    main = main_runs(suite, suite.sweep.settings()[0])
    assert len(sweep) == len(suite.sweep.settings()) * len(suite.sweep.systems)
    assert len(main) == len(suite.systems) * len(suite.seeds) == 36
    assert len({r.workdir for r in sweep + main}) == len(sweep + main)
    assert {r.config.seed for r in main} == set(suite.seeds) and {r.config.seed for r in sweep} == {suite.sweep.seed}
