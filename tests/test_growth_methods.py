"""Specification: growth methods are objects in one registry (``config.growth_methods``).
Each one the package ships resolves to a transform or a phase, and a method registered from
outside (CONTRIBUTING.md's recipe, ``tests/growth_method_example.py``) is planned, applied,
validated in a run config and refused where its rules say, with no other change."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from loire_jax import GrowthPlan, apply_model, grow, init_params, plan_growth, preset
from loire_jax.config import growth_methods
from loire_jax.config.growth_methods import growth_method, method_names, register, resolve
from loire_jax.config.stage import GrowthSpec, StageConfig
from loire_jax.errors import ConfigError, GrowthError
from loire_jax.growth.transforms import method_transform

CFG = preset("modern", vocab_size=32, max_seq_len=8, hidden=8, ffn=16, heads=2, head_dim=4, layers=2)
TOKENS = jax.random.randint(jax.random.key(1), (2, 8), 0, 32)


@pytest.fixture
def noisy(monkeypatch):
    """The example method registered for one test (the registry is restored after it)."""
    from growth_method_example import NOISY

    monkeypatch.setattr(growth_methods, "_METHODS", dict(growth_methods._METHODS))
    return register(NOISY)


def test_every_shipped_method_has_a_transform_or_a_phase_that_resolves():
    assert method_names()[:5] == ("loire", "random", "zero", "elle", "ligo")
    for name in method_names():
        method = growth_method(name)
        if method.transform is not None:
            assert callable(method_transform(method)), name
        else:
            assert method.phase is not None and callable(resolve(method.phase.runner)), name
            with pytest.raises(GrowthError, match="is learned"):
                method_transform(method)


def test_an_unknown_method_is_refused_naming_the_choices():
    with pytest.raises(GrowthError, match=r"unknown init 'lora'; choose one of \('loire', 'random'"):
        plan_growth(CFG, "ffn", 24, init="lora")
    with pytest.raises(ConfigError, match=r"init must be one of \('loire'.*got 'lora'"):
        GrowthSpec("ffn", 24, init="lora")


@pytest.mark.float64
def test_a_registered_method_is_planned_and_applied_by_grow(noisy, highest_precision):
    cfg = CFG.replace(dtype="float64", param_dtype="float64")
    params = init_params(cfg, jax.random.key(0))
    exact_cfg, exact = grow(cfg, params, "ffn", 24, jax.random.key(2))
    quiet_cfg, quiet = grow(cfg, params, "ffn", 24, jax.random.key(2), init="noisy", noise=0.0)
    assert quiet_cfg == exact_cfg and plan_growth(cfg, "ffn", 24, init="noisy", noise=0.0).function_preserving
    for path, x in flatten_dict(exact, sep="/").items():  # no noise: LOIRE's exact construction, bit for bit
        np.testing.assert_array_equal(flatten_dict(quiet, sep="/")[path], x)
    loud_cfg, loud = grow(cfg, params, "ffn", 24, jax.random.key(2), init="noisy")  # its default noise, 0.01
    plan = plan_growth(cfg, "ffn", 24, init="noisy")
    assert isinstance(plan, GrowthPlan) and not plan.function_preserving
    assert plan.reason == "noise std 0.01 on the new slots"
    up = "layers/mlp/up/kernel"
    w_old, w, w_exact = (flatten_dict(t, sep="/")[up] for t in (params, loud, exact))
    np.testing.assert_array_equal(w[..., :16], w_old)  # old slots untouched
    assert np.abs(w[..., 16:] - w_exact[..., 16:]).max() > 1e-3
    assert np.abs(apply_model(loud_cfg, loud, TOKENS) - apply_model(cfg, params, TOKENS)).max() > 1e-9


def test_a_registered_method_is_checked_in_a_run_config_by_its_fields(noisy):
    spec = GrowthSpec("ffn", 24, init="noisy", noise=0.02)  # it takes noise; LOIRE does not
    with pytest.raises(ConfigError, match="noise applies to init: elle or ligo or noisy only, not init: loire"):
        GrowthSpec("ffn", 24, noise=0.02)
    with pytest.raises(ConfigError, match="gate: open applies to LOIRE's gated layer copies"):
        GrowthSpec("layers", 4, init="elle", gate="open")
    StageConfig("M2", ("NEWS",), 10, growth=(spec, GrowthSpec("heads", 3)))  # mixes with LOIRE's: not alone
    with pytest.raises(ConfigError, match="growth mixes ELLE's expansion.*a stage grows one way"):
        StageConfig("M2", ("NEWS",), 10, growth=(GrowthSpec("ffn", 24, init="elle"), spec), reset_optimizer=True)


def test_register_refuses_a_taken_name_and_what_is_not_a_method(monkeypatch):
    monkeypatch.setattr(growth_methods, "_METHODS", dict(growth_methods._METHODS))
    with pytest.raises(ValueError, match="a growth method named 'elle' is already registered"):
        register(growth_method("elle"))
    with pytest.raises(TypeError, match="register takes a GrowthMethod"):
        register("elle")
