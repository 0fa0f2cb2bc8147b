"""Specification: the train step's distillation term, gate ramp and teacher sets (§2.6, App. D.1)."""

from __future__ import annotations

import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.traverse_util import flatten_dict
from tiers import tiered

from loire_jax import apply_model, grow, init_params, preset
from loire_jax.analysis.flops import forward_flops_per_token, train_flops_per_token
from loire_jax.config.schedule import Phase, phase_at
from loire_jax.config.shapes import leaf_axes
from loire_jax.train.optimizer import decay_mask, make_optimizer
from loire_jax.train.state import init_state, trainable
from loire_jax.train.step import StepSpec, gate_values, make_train_step

CFG = preset("paper", vocab_size=32, max_seq_len=8, hidden=8, ffn=16, heads=2, head_dim=4, layers=2, init_std=0.3)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 32, (4, 9)), jnp.int32)


def _one_step(spec, params, teachers):
    opt = make_optimizer("adam", learning_rate=1e-3)
    state = init_state(params, opt)
    return jax.jit(make_train_step(spec, opt))(state, {"tokens": TOKENS}, teachers)


@pytest.mark.slow
def test_kd_is_zero_when_the_teacher_is_the_student_and_positive_otherwise():
    params = init_params(CFG, jax.random.key(0))
    _, same = _one_step(StepSpec(CFG, teachers=(CFG,), betas=(0.1,)), params, (params,))
    assert abs(float(same["kd_loss"])) < 1e-6
    other = init_params(CFG, jax.random.key(1))
    _, diff = _one_step(StepSpec(CFG, teachers=(CFG,), betas=(0.1,)), params, (other,))
    assert float(diff["kd_loss"]) > 1e-4
    np.testing.assert_allclose(float(diff["loss"]), float(diff["lm_loss"] + diff["kd_loss"]), rtol=1e-6)


@pytest.mark.slow
def test_each_teacher_keeps_its_own_architecture():
    """A grown student distils from its smaller ancestor; growth kept the function, so KD ~ 0."""
    small = init_params(CFG, jax.random.key(0))
    big_cfg, big = grow(CFG, small, "hidden", 16, jax.random.key(2))
    big_cfg, big = grow(big_cfg, big, "layers", 3)
    _, m = _one_step(StepSpec(big_cfg, teachers=(CFG, CFG), betas=(0.1, 0.2)), big, (small, small))
    assert abs(float(m["kd_loss"])) < 1e-5
    _, without = _one_step(StepSpec(big_cfg), big, ())
    np.testing.assert_allclose(float(m["lm_loss"]), float(without["lm_loss"]), rtol=1e-6)


@pytest.mark.slow
@pytest.mark.float64
@pytest.mark.parametrize("microbatches", [1, 2])
def test_a_stage_s_one_program_distils_inside_its_window_and_nowhere_else(microbatches):
    """A stage runs one program for all its phases: with ``distill_window`` it is, step by
    step, the step with teachers inside the window and the step without them outside it, in
    the state and every metric, to float64 rounding: two programs need not round alike, as
    XLA fuses each its own way (XLA:CPU's older fusion code generator, which the test
    session uses, differs from the newer one in the last bit of a few entries)."""
    cfg = CFG.replace(dtype="float64", param_dtype="float64")
    small = init_params(cfg, jax.random.key(0))
    big_cfg, big = grow(cfg, small, "hidden", 16, jax.random.key(2))
    teacher = init_params(cfg, jax.random.key(1))  # not the student's ancestor: KD is far from 0
    opt = make_optimizer("adam", learning_rate=1e-2)
    kd = dict(teachers=(cfg,), betas=(0.3,), microbatches=microbatches)
    merged = jax.jit(make_train_step(StepSpec(big_cfg, distill_window=(1, 3), **kd), opt))
    with_teachers = jax.jit(make_train_step(StepSpec(big_cfg, **kd), opt))
    plain = jax.jit(make_train_step(StepSpec(big_cfg, microbatches=microbatches), opt))
    state, batch = init_state(big, opt), {"tokens": TOKENS}
    for step in range(5):
        inside = 1 <= step < 3
        want = with_teachers(state, batch, (teacher,)) if inside else plain(state, batch, ())
        got = merged(state, batch, (teacher,))
        assert (float(got[1]["kd_loss"]) > 1e-3) is inside
        # atol: the attention key bias has a zero gradient, so its entries are rounding noise
        # (~1e-12) that Adam scales up; every other entry agrees to ~1e-16 relative.
        chex.assert_trees_all_close(got, want, rtol=1e-13, atol=1e-10)
        state = want[0]


def test_a_distillation_window_needs_teachers_and_a_positive_length():
    with pytest.raises(ValueError, match="distillation window"):
        StepSpec(CFG, distill_window=(0, 2))
    with pytest.raises(ValueError, match="distillation window"):
        StepSpec(CFG, teachers=(CFG,), betas=(0.1,), distill_window=(2, 2))


def test_gate_ramp_takes_its_scheduled_values():
    base = jnp.array([1.0, 0.0, 1.0, 0.0])
    mask = jnp.array([False, True, False, True])
    got = [np.asarray(gate_values(jnp.asarray(s), base, mask, 4)) for s in (0, 1, 2, 4, 9)]
    expected = [[1, 0, 1, 0], [1, .25, 1, .25], [1, .5, 1, .5], [1, 1, 1, 1], [1, 1, 1, 1]]
    np.testing.assert_allclose(np.array(got), np.array(expected))


@pytest.mark.slow
def test_the_step_writes_the_ramp_into_the_gates_and_never_trains_them():
    params = init_params(CFG, jax.random.key(0))
    cfg2, grown = grow(CFG, params, "layers", 4)
    spec = StepSpec(cfg2, ramp_layers=(1, 3), ramp_steps=4)
    opt = make_optimizer("adamw", learning_rate=1e-2, weight_decay=0.1)
    state = init_state(grown, opt)
    step = jax.jit(make_train_step(spec, opt))
    alphas = []
    for _ in range(6):
        state, m = step(state, {"tokens": TOKENS}, ())
        alphas.append(float(m["alpha"]))
        assert float(state.params["gates"][0]) == 1.0  # originals: untouched by weight decay
    np.testing.assert_allclose(alphas, [0, .25, .5, .75, 1, 1])


def test_training_flops_count_teachers_and_the_backward_pass():
    fwd = forward_flops_per_token(CFG, 8)
    assert train_flops_per_token(CFG, 8) == pytest.approx(3 * fwd)
    assert train_flops_per_token(CFG, 8, (CFG, CFG)) == pytest.approx(5 * fwd)


# --------------------------------------------------------------------------- weight decay
@pytest.mark.parametrize("arch", tiered(list(itertools.product(("layernorm", "rmsnorm"), ("pre", "post"), (True, False),
                                                               (True, False))), lambda i, a: i % 8 == 0, unpack=False),
                         ids=lambda a: "-".join(map(str, a)))
def test_weight_decay_hits_matrices_and_embeddings_only(arch):
    """Every leaf of every architecture: decayed iff it is a kernel or an embedding. Stacked
    layers make norm gains and biases 2-D, so a rank test cannot tell them apart."""
    norm, position, tied, bias = arch
    cfg = preset("paper", vocab_size=16, max_seq_len=8, hidden=8, ffn=16, heads=2, head_dim=4, layers=2,
                 norm=norm, norm_position=position, tie_embeddings=tied, use_bias=bias)
    params = trainable(init_params(cfg, jax.random.key(0)))
    mask = flatten_dict(decay_mask(params), sep="/")
    assert set(mask) == set(leaf_axes(cfg)) - {"gates"}
    for path, decayed in mask.items():
        want = path.endswith("/kernel") or path.endswith("/embedding")
        assert decayed == want, f"{path}: decayed={decayed}"
    # and AdamW leaves the others alone: a zero gradient moves only decayed leaves
    opt = make_optimizer("adamw", learning_rate=0.1, weight_decay=0.5, clip_norm=None)
    updates, _ = opt.update(jax.tree_util.tree_map(jnp.zeros_like, params), opt.init(params), params)
    for path, u in flatten_dict(updates, sep="/").items():
        assert bool(np.any(np.asarray(u))) == mask[path], path


def test_unknown_leaf_kind_is_refused():
    with pytest.raises(ValueError, match="has no kind"):
        decay_mask({"my_adapter": {"lora_a": jnp.ones((2, 2))}})


# --------------------------------------------------------------------------- no silent fallbacks
@pytest.mark.float64
@pytest.mark.slow
def test_float64_runs_keep_float64_logits():
    cfg = CFG.replace(dtype="float64", param_dtype="float64")
    params = init_params(cfg, jax.random.key(0))
    logits = apply_model(cfg, params, TOKENS[:, :-1])
    nll = optax.losses.softmax_cross_entropy_with_integer_labels(logits, TOKENS[:, 1:])
    assert logits.dtype == nll.dtype == jnp.float64
    bf16 = CFG.replace(dtype="bfloat16")
    logits16 = apply_model(bf16, init_params(bf16, jax.random.key(0)), TOKENS[:, :-1])
    assert logits16.dtype == jnp.float32  # low-precision compute is still reduced in float32


def test_a_step_outside_the_stage_is_an_error():
    stage_phases = [Phase("warmup", 0, 5, True, False), Phase("train", 5, 10, False, False)]
    assert phase_at(stage_phases, 9).name == "train"
    with pytest.raises(ValueError, match="outside the stage"):
        phase_at(stage_phases, 10)


def test_each_step_reports_the_learning_rate_its_update_applied():
    """The "lr" metric is the schedule at the optimizer's own count: a restarted schedule
    (growth) starts over, and a step at lr 0 leaves the parameters as they were."""
    from loire_jax.train.optimizer import restart_schedules

    schedule = optax.linear_schedule(0.0, 1e-2, 4)
    opt = make_optimizer("adam", learning_rate=schedule, clip_norm=None)
    step = jax.jit(make_train_step(StepSpec(CFG), opt, schedule))
    state = init_state(init_params(CFG, jax.random.key(0)), opt)
    first, metrics = step(state, {"tokens": TOKENS})
    chex.assert_trees_all_equal(trainable(first.params), trainable(state.params))  # lr 0: no change
    lrs = [float(metrics["lr"])]
    for _ in range(4):
        first, metrics = step(first, {"tokens": TOKENS})
        lrs.append(float(metrics["lr"]))
    np.testing.assert_allclose(lrs, [0.0, 2.5e-3, 5e-3, 7.5e-3, 1e-2], rtol=1e-6)
    restarted = first.replace(opt_state=restart_schedules(first.opt_state))
    assert float(step(restarted, {"tokens": TOKENS})[1]["lr"]) == 0.0
    assert "lr" not in jax.jit(make_train_step(StepSpec(CFG), opt))(state, {"tokens": TOKENS})[1]
