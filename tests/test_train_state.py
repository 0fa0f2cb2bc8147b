"""Specification: a stage boundary is one pure function. ``grow_train_state`` grows the
parameters function-preservingly and Adam's moments with them, restarts the LR schedule
(not Adam's bias correction), starts the stage at step 0, and lays the result out as asked.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.traverse_util import flatten_dict

from loire_jax import apply_model, grow_optimizer_state, init_params, plan_growth, preset
from loire_jax.config.optimizer import OptimizerConfig
from loire_jax.growth.transforms import grow_like
from loire_jax.parallel.sharding import make_mesh
from loire_jax.train.optimizer import optimizer_for
from loire_jax.train.state import (
    TrainState,
    grow_train_state,
    init_state,
    restart_schedules,
    state_shardings,
    trainable,
)

CFG = preset("modern", vocab_size=64, max_seq_len=16, hidden=16, ffn=32, heads=2, head_dim=8, layers=2)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 64, (4, 9)), jnp.int32)
OPT = optimizer_for(OptimizerConfig(name="adamw", lr=1e-2, weight_decay=0.1, warmup_steps=2), steps=10)


@functools.lru_cache(maxsize=None)  # immutable arrays: the tests share one computation
def _trained(steps: int = 3) -> TrainState:
    """A state some steps into a stage: non-zero moments, counters at ``steps``."""
    params = init_params(CFG, jax.random.key(0))
    state = init_state(params, OPT)

    def loss(p):
        return jnp.mean(apply_model(CFG, {**p, "gates": state.params["gates"]}, TOKENS) ** 2)

    for _ in range(steps):
        grads = jax.grad(loss)(trainable(state.params))
        updates, opt_state = OPT.update(grads, state.opt_state, trainable(state.params))
        state = TrainState({**optax.apply_updates(trainable(state.params), updates), "gates": state.params["gates"]},
                           opt_state, state.step + 1)
    return state


def _counts(opt_state) -> dict[str, int]:
    return {tuple_name: int(v) for (*_, key), v in optax.tree_utils.tree_get_all_with_path(opt_state, "count")
            for tuple_name in [key.tuple_name]}


@pytest.mark.slow
def test_restart_schedules_zeroes_the_schedule_and_keeps_adams_count():
    state = _trained()
    assert _counts(state.opt_state) == {"ScaleByAdamState": 3, "ScaleByScheduleState": 3}
    assert _counts(restart_schedules(state.opt_state)) == {"ScaleByAdamState": 3, "ScaleByScheduleState": 0}
    constant = optax.adam(1e-3)  # no schedule, no counter to restart
    s = constant.init({"w": jnp.ones(2)})
    assert restart_schedules(s) is s


@pytest.mark.slow
@pytest.mark.parametrize("ops", [[("ffn", 48)], [("hidden", 32), ("layers", 3)]])
def test_grow_train_state_is_growth_of_each_part_laid_out_as_asked(ops):
    state = _trained()
    plans, cfg = [], CFG
    for op, size in ops:
        plans.append(plan_growth(cfg, op, size))
        cfg = plans[-1].new
    mesh = make_mesh({"data": 1, "fsdp": 2, "tensor": 2})
    shardings = state_shardings(cfg, mesh, OPT)
    key = jax.random.key(7)
    grown = grow_train_state(plans, state, key, shardings)

    params, opt_state = state.params, state.opt_state  # the same growth, part by part
    for i, plan in enumerate(plans):
        params = grow_like(plan, params, jax.random.fold_in(key, i))
        opt_state = grow_optimizer_state(plan, opt_state)
    # one compiled program vs. op by op: the float32 rounding of new slots may differ by an ulp
    for path, want in flatten_dict(params, sep="/").items():
        np.testing.assert_allclose(flatten_dict(grown.params, sep="/")[path], want, rtol=1e-6, atol=1e-9,
                                   err_msg=path)
    for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(grown.opt_state),
                                 jax.tree_util.tree_leaves(restart_schedules(opt_state))):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12, err_msg=jax.tree_util.keystr(path))
    assert int(grown.step) == 0 and _counts(grown.opt_state) == {"ScaleByAdamState": 3, "ScaleByScheduleState": 0}
    for leaf, sharding in zip(jax.tree_util.tree_leaves(grown), jax.tree_util.tree_leaves(shardings)):
        assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)
    with jax.default_matmul_precision("highest"):  # growth preserves the function (float32 bound)
        before, after = apply_model(CFG, state.params, TOKENS), apply_model(cfg, grown.params, TOKENS)
    np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_reset_optimizer_starts_fresh_moments():
    state = _trained()
    plan = plan_growth(CFG, "ffn", 48)
    mesh = make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
    grown = grow_train_state([plan], state, jax.random.key(1), state_shardings(plan.new, mesh, OPT),
                             reset_optimizer=OPT)
    fresh = OPT.init(trainable(grown.params))
    for got, want in zip(jax.tree_util.tree_leaves(grown.opt_state), jax.tree_util.tree_leaves(fresh)):
        np.testing.assert_array_equal(got, want)
    assert _counts(grown.opt_state) == {"ScaleByAdamState": 0, "ScaleByScheduleState": 0}
