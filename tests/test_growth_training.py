"""Specification: grown models train. New weights are not dead under init='loire'.
(The optimizer state grown with them is specified in test_optimizer_growth.py.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.traverse_util import flatten_dict

from loire_jax import ModelConfig, apply_model, grow, init_params

pytestmark = pytest.mark.slow  # the slow tier: end-to-end runs and CLI subprocesses

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
    old, new, trained = flatten_dict(params, sep="/"), flatten_dict(grown, sep="/"), flatten_dict(p, sep="/")
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
