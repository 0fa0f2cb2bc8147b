"""Specification: grown models train. New weights are not dead under init='loire', and the
companion transform grows Adam's moments consistently with the parameters."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from loire_jax import ModelConfig, apply_model, grow, grow_optimizer_state, init_params, plan_growth
from loire_jax.growth import grow_like
from loire_jax.layout import flatten

ARCHS = [
    dict(norm="layernorm", norm_position="post", activation="gelu", position="learned", tie_embeddings=True),
    dict(norm="layernorm", norm_position="pre", activation="gelu", position="learned", tie_embeddings=False),
    dict(norm="rmsnorm", norm_position="pre", activation="swiglu", position="rope", tie_embeddings=False,
         use_bias=False),
]
SIZES = {"hidden": 16, "ffn": 14, "heads": 3, "layers": 4}


def _cfg(arch) -> ModelConfig:
    return ModelConfig(vocab_size=16, max_seq_len=8, hidden=8, ffn=8, heads=2, head_dim=4, layers=2,
                       init_std=0.2, **arch)


def _loss(cfg, params, tokens):
    logits = apply_model(cfg, params, tokens[:, :-1])
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1))


def _new_slots(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Mask of the entries of `new` that lie outside the old array's corner."""
    mask = np.ones(new.shape, bool)
    mask[tuple(slice(0, s) for s in old.shape)] = False
    return mask


@pytest.mark.parametrize("arch", ARCHS, ids=["paper", "prenorm-ln", "modern"])
@pytest.mark.parametrize("op", sorted(SIZES))
def test_new_weights_learn_after_loire_growth(arch, op):
    cfg = _cfg(arch)
    params = init_params(cfg, jax.random.key(0))
    cfg2, grown = grow(cfg, params, op, SIZES[op], jax.random.key(1))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (4, 8)), jnp.int32)
    opt = optax.adam(1e-2)
    state = opt.init(grown)
    step_fn = jax.jit(lambda p, s: _step(cfg2, opt, p, s, tokens))
    p = grown
    for step in range(1, 4):
        if op == "layers":  # the gate ramp (training issue) opens the copies from step 1 on
            ramp = 10.0
            p = {**p, "gates": jnp.where(grown["gates"] == 0.0, step / ramp, p["gates"])}
        p, state = step_fn(p, state)
    old, new, trained = flatten(params), flatten(grown), flatten(p)
    checked = 0
    for path in new:
        if path == "gates":
            continue
        if op == "layers":
            if not path.startswith("layers/"):
                continue
            copies = np.asarray(grown["gates"]) == 0.0
            region = np.zeros(new[path].shape, bool)
            region[copies] = True
        elif new[path].shape == old[path].shape:
            continue
        else:
            region = _new_slots(np.asarray(old[path]), np.asarray(new[path]))
        changed = np.abs(np.asarray(trained[path]) - np.asarray(new[path]))[region]
        assert changed.max() > 0, f"new slots of {path} did not move after 3 Adam steps"
        checked += 1
    assert checked > 0


def _step(cfg, opt, params, state, tokens):
    grads = jax.grad(lambda p: _loss(cfg, p, tokens))(params)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state


def test_optimizer_state_grows_with_the_parameters():
    """Old slots carry over, new slots are 0, rescaled gains rescale mu by c and nu by c**2,
    the step count is kept, and the result feeds optax without error."""
    cfg = _cfg(dict(norm="rmsnorm", norm_position="pre", activation="gelu", position="learned",
                    tie_embeddings=False))
    params = init_params(cfg, jax.random.key(0))
    opt = optax.adam(1e-2)
    state = opt.init(params)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 16, (4, 8)), jnp.int32)
    params, state = jax.jit(lambda p, s: _step(cfg, opt, p, s, tokens))(params, state)

    plan = plan_growth(cfg, "hidden", 12)  # zero_pad: gains scaled by sqrt(8/12)
    key = jax.random.key(5)
    grown_state = grow_optimizer_state(plan, state, key)
    adam = grown_state[0]
    assert int(adam.count) == int(state[0].count)
    c = np.sqrt(8 / 12)
    mu_old, nu_old = flatten(state[0].mu), flatten(state[0].nu)
    mu_new, nu_new = flatten(adam.mu), flatten(adam.nu)
    np.testing.assert_allclose(mu_new["layers/norm_attn/scale"][:, :8], mu_old["layers/norm_attn/scale"] * c)
    np.testing.assert_allclose(nu_new["layers/norm_attn/scale"][:, :8], nu_old["layers/norm_attn/scale"] * c**2)
    np.testing.assert_array_equal(mu_new["layers/mlp/up/kernel"][:, :8], mu_old["layers/mlp/up/kernel"])
    assert not np.any(np.asarray(mu_new["layers/mlp/up/kernel"][:, 8:]))
    assert not np.any(np.asarray(nu_new["embed/embedding"][:, 8:]))
    grown = grow_like(plan, params, key)
    assert jax.tree_util.tree_structure(grown) == jax.tree_util.tree_structure(adam.mu)
    for a, b in zip(jax.tree_util.tree_leaves(grown), jax.tree_util.tree_leaves(adam.nu)):
        assert a.shape == b.shape
    opt.update(jax.tree_util.tree_map(jnp.ones_like, grown), grown_state, grown)


def test_duplicate_split_moments_use_the_parameter_split():
    """Reader rows split as W*s_j get first moments m*s_j and second moments v*s_j**2."""
    cfg = _cfg(dict(norm="layernorm", norm_position="post", activation="gelu", position="learned",
                    tie_embeddings=False))
    params = init_params(cfg, jax.random.key(0))
    plan = plan_growth(cfg, "hidden", 16)
    key = jax.random.key(3)
    ones = jax.tree_util.tree_map(jnp.ones_like, params)
    split_p = flatten(grow_like(plan, params, key))["layers/mlp/up/kernel"]
    split_m = flatten(grow_like(plan, ones, key, moment=1))["layers/mlp/up/kernel"]
    split_v = flatten(grow_like(plan, ones, key, moment=2))["layers/mlp/up/kernel"]
    w = np.asarray(params["layers"]["mlp"]["up"]["kernel"])
    factors = np.asarray(split_p) / np.concatenate([w, w], axis=1)
    np.testing.assert_allclose(np.asarray(split_m), factors, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(split_v), factors**2, rtol=1e-5)
    np.testing.assert_allclose(factors[:, :8] + factors[:, 8:], 1.0, rtol=1e-6)
    assert np.std(factors) > 0.01  # the split is random: copies are not symmetric
