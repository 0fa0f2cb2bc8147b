"""Specification: the train step's distillation term, gate ramp and teacher sets (§2.6, App. D.1)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from loire_jax import grow, init_params, preset
from loire_jax.flops import forward_flops_per_token, train_flops_per_token
from loire_jax.train_step import StepSpec, gate_values, init_state, make_optimizer, make_train_step

CFG = preset("paper", vocab_size=32, max_seq_len=8, hidden=8, ffn=16, heads=2, head_dim=4, layers=2, init_std=0.3)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 32, (4, 9)), jnp.int32)


def _one_step(spec, params, teachers):
    opt = make_optimizer("adam", learning_rate=1e-3)
    state = init_state(params, opt, jax.random.key_data(jax.random.key(0)))
    return jax.jit(make_train_step(spec, opt))(state, {"tokens": TOKENS}, teachers)


def test_kd_is_zero_when_the_teacher_is_the_student_and_positive_otherwise():
    params = init_params(CFG, jax.random.key(0))
    _, same = _one_step(StepSpec(CFG, teachers=(CFG,), betas=(0.1,)), params, (params,))
    assert abs(float(same["kd_loss"])) < 1e-6
    other = init_params(CFG, jax.random.key(1))
    _, diff = _one_step(StepSpec(CFG, teachers=(CFG,), betas=(0.1,)), params, (other,))
    assert float(diff["kd_loss"]) > 1e-4
    np.testing.assert_allclose(float(diff["loss"]), float(diff["lm_loss"] + diff["kd_loss"]), rtol=1e-6)


def test_each_teacher_keeps_its_own_architecture():
    """A grown student distils from its smaller ancestor; growth kept the function, so KD ~ 0."""
    small = init_params(CFG, jax.random.key(0))
    big_cfg, big = grow(CFG, small, "hidden", 16, jax.random.key(2))
    big_cfg, big = grow(big_cfg, big, "layers", 3)
    _, m = _one_step(StepSpec(big_cfg, teachers=(CFG, CFG), betas=(0.1, 0.2)), big, (small, small))
    assert abs(float(m["kd_loss"])) < 1e-5
    _, without = _one_step(StepSpec(big_cfg), big, ())
    np.testing.assert_allclose(float(m["lm_loss"]), float(without["lm_loss"]), rtol=1e-6)


def test_gate_ramp_takes_its_scheduled_values():
    base = jnp.array([1.0, 0.0, 1.0, 0.0])
    mask = jnp.array([False, True, False, True])
    got = [np.asarray(gate_values(jnp.asarray(s), base, mask, 0, 4)) for s in (0, 1, 2, 4, 9)]
    expected = [[1, 0, 1, 0], [1, .25, 1, .25], [1, .5, 1, .5], [1, 1, 1, 1], [1, 1, 1, 1]]
    np.testing.assert_allclose(np.array(got), np.array(expected))


def test_the_step_writes_the_ramp_into_the_gates_and_never_trains_them():
    params = init_params(CFG, jax.random.key(0))
    cfg2, grown = grow(CFG, params, "layers", 4)
    spec = StepSpec(cfg2, ramp_layers=(1, 3), ramp_steps=4)
    opt = make_optimizer("adamw", learning_rate=1e-2, weight_decay=0.1)
    state = init_state(grown, opt, jax.random.key_data(jax.random.key(0)))
    step = jax.jit(make_train_step(spec, opt))
    alphas = []
    for _ in range(6):
        state, m = step(state, {"tokens": TOKENS}, ())
        alphas.append(float(m["alpha"]))
        assert float(state["params"]["gates"][0]) == 1.0  # originals: untouched by weight decay
    np.testing.assert_allclose(alphas, [0, .25, .5, .75, 1, 1])


def test_training_flops_count_teachers_and_the_backward_pass():
    fwd = forward_flops_per_token(CFG, 8)
    assert train_flops_per_token(CFG, 8) == pytest.approx(3 * fwd)
    assert train_flops_per_token(CFG, 8, (CFG, CFG)) == pytest.approx(5 * fwd)
